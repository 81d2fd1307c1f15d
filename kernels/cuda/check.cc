#include "kernels/cuda/check.h"

#include "runtime/error.h"

namespace tessel::kernels::cuda {

void fail_cuda(const char* op, const char* expr, int code, const char* name, const char* text, const char* file,
               int line) {
  TESSEL_FAIL(op, "CUDA error {} ({}, code {}) in {} at {}:{}", name ? name : "?", text ? text : "?", code, expr, file,
              line);
}

void fail(const char* op, const char* message) { TESSEL_FAIL(op, "{}", message); }

}  // namespace tessel::kernels::cuda
