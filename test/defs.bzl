"""tessel_tests: one cc_test per test_*.cc file, all sharing the Catch2 main."""

def tessel_tests(srcs, deps, size = "small", tags = [], data = [], shard_counts = {}, sizes = {}):
    for src in srcs:
        name = src[:-len(".cc")]
        native.cc_test(
            name = name,
            srcs = [src],
            size = sizes.get(name, size),
            tags = tags,
            data = data,
            shard_count = shard_counts.get(name, None),
            deps = deps + ["//test:test_main"],
        )
