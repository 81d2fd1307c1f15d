"""example(name): examples/<name>.cc as a program, and <name>_test running it."""

def example(name, size = "medium", deps = []):
    native.cc_binary(
        name = name,
        srcs = [name + ".cc"],
        deps = ["//:tessel"] + deps,
    )
    native.sh_test(
        name = name + "_test",
        srcs = ["run_example.sh"],
        args = ["$(location :%s)" % name],
        data = [":" + name],
        size = size,
    )
