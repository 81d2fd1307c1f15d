"""The external repositories tessel needs, for its own WORKSPACE and for a
workspace that uses tessel as a library (docs/build.md):

    local_repository(name = "tessel", path = "/path/to/tessel")
    load("@tessel//:deps.bzl", "tessel_dependencies")
    tessel_dependencies(path = "/path/to/tessel")

Everything is local (offline): stand-ins for Bazel's rules repositories, the
Debian system libraries tools/deps.sh installs, and the CUDA toolkit when one
is detected (@local_cuda; TESSEL_NO_CUDA=1 for a CPU-only build).
"""

load("@tessel//third_party/cuda:cuda_configure.bzl", "cuda_configure")

def tessel_dependencies(path):
    """Declares tessel's external repositories; `path` is tessel's root folder."""

    # Bazel 4.2's own @bazel_tools refers to rules_cc, rules_java,
    # rules_proto, rules_python and remote_coverage_tools, which it would
    # download. Local stand-ins re-export the native rules: no network.
    native.local_repository(name = "rules_cc", path = path + "/third_party/rules_cc")
    native.local_repository(name = "rules_java", path = path + "/third_party/rules_java")
    native.local_repository(name = "rules_proto", path = path + "/third_party/rules_proto")
    native.local_repository(name = "rules_python", path = path + "/third_party/rules_python")
    native.local_repository(name = "remote_coverage_tools", path = path + "/third_party/coverage_tools")

    # System libraries, installed from Debian (tools/deps.sh).
    system = {
        "eigen": "/usr/include/eigen3",
        "fmt": "/usr/include/fmt",
        "spdlog": "/usr/include/spdlog",
        "catch2": "/usr/include/catch2",
        "nlohmann_json": "/usr/include/nlohmann",
        "cli11": "/usr/include/CLI",
        "tomlplusplus": "/usr/include/toml++",
        "openmpi": "/usr/lib/x86_64-linux-gnu/openmpi",
        "openblas": "/usr/include/x86_64-linux-gnu/openblas-pthread",
    }
    for name, where in system.items():
        native.new_local_repository(
            name = name,
            path = where,
            build_file = "@tessel//third_party/system:%s.BUILD" % name,
        )

    # CUDA: detected at fetch time (CUDA_PATH, else /usr/local/cuda). Without
    # it @local_cuda//:cuda_available is false and the build is CPU-only.
    cuda_configure(name = "local_cuda")
