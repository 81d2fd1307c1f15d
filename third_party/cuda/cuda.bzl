"""cuda_library: compiles .cu files with nvcc and wraps them in a cc_library.

Each .cu becomes one object through a genrule running the detected nvcc; the
objects plus cudart form a normal cc_library that C++ targets depend on.
Without CUDA the macro yields a header-only cc_library (callers guard their use
with TESSEL_WITH_CUDA, which `cuda_defines()` sets only when CUDA is present).
"""

load("@local_cuda//:defs.bzl", "CUDA_ARCHS", "CUDA_AVAILABLE", "CUDNN_FRONTEND", "NVCC")

def cuda_available():
    return CUDA_AVAILABLE

def cudnn_frontend_available():
    """cuDNN's C++ frontend headers were found (tools/deps.sh installs them)."""
    return CUDNN_FRONTEND

def cuda_defines():
    return ["TESSEL_WITH_CUDA=1"] if CUDA_AVAILABLE else []

def _gencode_flags():
    flags = []
    for a in CUDA_ARCHS:
        flags.append("-gencode=arch=compute_%s,code=sm_%s" % (a, a))
    return " ".join(flags)

def cuda_library(name, srcs, hdrs = [], deps = [], cu_hdrs = [], nvcc_flags = [], **kwargs):
    """srcs: .cu files; cu_hdrs: headers (ours) the .cu files include."""
    if not CUDA_AVAILABLE:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, **kwargs)
        return
    objs = []
    for src in srcs:
        obj = "_%s_objs/%s.o" % (name, src.replace(".cu", ""))
        native.genrule(
            name = "_%s_%s_nvcc" % (name, src.replace("/", "_").replace(".", "_")),
            srcs = [src] + hdrs + cu_hdrs,
            outs = [obj],
            cmd = " ".join([
                NVCC,
                "-c -std=c++17 -O3 --expt-relaxed-constexpr",
                "-Xcompiler -fPIC -Xcompiler -ffp-contract=off --fmad=false",
                "-DTESSEL_WITH_CUDA=1",
                "-I. -I$(GENDIR)",
                _gencode_flags(),
                " ".join(nvcc_flags),
                "$(location %s) -o $@" % src,
            ]),
            message = "nvcc %s" % src,
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        defines = ["TESSEL_WITH_CUDA=1"],
        alwayslink = True,
        **kwargs
    )
