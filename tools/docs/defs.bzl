"""doc_snippets: compile every C++ block of some markdown files (tools/docs/snippets.cc)."""

def doc_snippets(name, docs):
    srcs = []
    for doc in docs:
        stem = doc.split(":")[-1].split("/")[-1].replace(".md", "")
        out = "%s_%s.cc" % (name, stem)
        native.genrule(
            name = "%s_%s_gen" % (name, stem),
            srcs = [doc],
            outs = [out],
            cmd = "$(location //tools/docs:snippets) $@ $(location %s)" % doc,
            tools = ["//tools/docs:snippets"],
        )
        srcs.append(out)
    native.cc_library(
        name = name,
        srcs = srcs,
        deps = ["//:tessel", "//tools/docs:registry"],
        alwayslink = True,
    )
    native.cc_test(
        name = name + "_test",
        srcs = ["//tools/docs:snippets_test.cc"],
        data = docs,
        deps = [":" + name, "//tools/docs:registry", "//test:test_main"],
    )
