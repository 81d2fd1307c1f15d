#pragma once
// Launcher of the bitwise CUDA GEMM (gemm.cu; docs/gemm.md's arithmetic, the
// tiling in gemm_plan.h); the bmm adapter is in matmul.cc.
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/gemm_plan.h"
#include "runtime/dtype.h"

namespace tessel::kernels::cuda {

struct GemmParams {
  int64_t M = 0, N = 0, K = 0, batch = 1;
  // Element (i, k) of A[b] at A + b * a_bs + i * a_rs + k * a_cs; likewise B;
  // C[b] row-major with row stride c_rs and unit column stride.
  int64_t a_rs = 0, a_cs = 0, a_bs = 0;
  int64_t b_rs = 0, b_cs = 0, b_bs = 0;
  int64_t c_rs = 0, c_bs = 0;
  int chunks = 16;
  bool accumulate = false;
  const void* A = nullptr;
  const void* B = nullptr;
  void* C = nullptr;
};

// `work`: plan.workspace_elems values of the compute type (float, or double
// for float64), or null when the plan needs none. dtype: A, B and C
// (float32/float64, or bfloat16/float16 computed in float, rounded once).
void launch_gemm_bitwise(DType dtype, const GemmParams& p, const BitwiseGemmPlan& plan, void* work,
                         cudaStream_t stream);

}  // namespace tessel::kernels::cuda
