#pragma once
// Error checks for every CUDA runtime call: TESSEL_CUDA_CHECK(expr, "op")
// throws tessel::Error("op: CUDA error <name> (<text>) in <expr> at file:line").
//
// Usable from .cu files (nvcc) and host .cc files alike: the failure
// functions are plain declarations, defined in check.cc (which formats with
// fmt, a library nvcc never sees).
#include <cuda_runtime.h>

#include "runtime/dtype.h"

namespace tessel::kernels::cuda {

[[noreturn]] void fail_cuda(const char* op, const char* expr, int code, const char* name, const char* text,
                            const char* file, int line);
// "op: message" as a tessel::Error.
[[noreturn]] void fail(const char* op, const char* message);

}  // namespace tessel::kernels::cuda

#define TESSEL_CUDA_CHECK(expr, op)                                                                            \
  do {                                                                                                         \
    const cudaError_t tessel_cuda_err_ = (expr);                                                               \
    if (__builtin_expect(tessel_cuda_err_ != cudaSuccess, 0)) {                                                \
      (void)cudaGetLastError(); /* clear a non-sticky error so later calls do not report it again */           \
      ::tessel::kernels::cuda::fail_cuda((op), #expr, int(tessel_cuda_err_), cudaGetErrorName(tessel_cuda_err_), \
                                         cudaGetErrorString(tessel_cuda_err_), __FILE__, __LINE__);            \
    }                                                                                                          \
  } while (0)

// After a <<<...>>> launch: reports a bad configuration (or an earlier
// asynchronous error) naming the kernel's op.
#define TESSEL_CUDA_CHECK_LAUNCH(op) TESSEL_CUDA_CHECK(cudaGetLastError(), op)
