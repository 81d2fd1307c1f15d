#pragma once
// How a tessel matmul maps onto cuBLASLt (fast mode; cublaslt.cc), as plain
// data so the choice is tested on the CPU (test_cuda_plan).
//
// tessel is row-major, cuBLASLt column-major: a row-major X (r x c, row
// stride ld) is the column-major X^T (c x r, ld). So out = a . b becomes the
// column-major problem out^T (N x M) = b^T (N x K) . a^T (K x M): cuBLASLt's
// "A" is tessel's b and its "B" is tessel's a. An operand whose rows are
// contiguous is used as stored (op N), one whose columns are contiguous
// through op T; any other layout (or a leading dimension cuBLASLt rejects)
// makes the plan "not ok" and the caller uses the bitwise kernel.
//
// Determinism (docs/design.md §4 levels 1-2 in fast mode): float32 accumulation
// (CUBLAS_COMPUTE_32F, no TF32), a user-owned workspace of fixed size, one
// algorithm chosen per problem and cached for the process, and no in-place
// split-K reduction (its ordering uses counters in the workspace).
#include <cstdint>

#include "runtime/dtype.h"

namespace tessel::kernels::cuda {

enum class LtEpilogue : uint8_t {
  None,         // D = alpha * A.B + beta * C
  Bias,         // + bias[j] (per output column of the row-major result)
  Gelu,         // gelu_tanh(...)
  GeluBias,     // gelu_tanh(... + bias[j])
  GeluAuxBias,  // as GeluBias, and the pre-activation stored to `aux` (for backward)
};

struct LtOperand {
  bool trans = false;     // cuBLASLt op: N (false) or T (true)
  int64_t rows = 0;       // of the stored column-major matrix
  int64_t cols = 0;
  int64_t ld = 0;
  int64_t batch_stride = 0;
};

struct LtPlan {
  bool ok = false;
  const char* why = "";  // when !ok
  int64_t m = 0, n = 0, k = 0, batch = 1;  // column-major D (m x n) = op(A) (m x k) . op(B) (k x n)
  LtOperand a, b, d;  // a = tessel's b, b = tessel's a, d = tessel's out
  // cublasLt enumerators, as integers (cublaslt.cc static_asserts them).
  int data_type = 0;     // cudaDataType of A, B, C, D
  int compute_type = 0;  // cublasComputeType_t
  int scale_type = 0;    // cudaDataType of alpha/beta
  int epilogue = 0;      // cublasLtEpilogue_t
};

// out[b] (M x N, row stride c_rs, batch stride c_bs) = a[b] (M x K) . b[b] (K x N);
// strides in elements.
LtPlan plan_lt_matmul(int64_t M, int64_t N, int64_t K, int64_t batch, int64_t a_rs, int64_t a_cs, int64_t a_bs,
                      int64_t b_rs, int64_t b_cs, int64_t b_bs, int64_t c_rs, int64_t c_bs, DType dtype,
                      LtEpilogue epilogue);

// The cublasLt constants the plan uses (mirrors of the toolkit's enums).
namespace lt_const {
inline constexpr int kR32F = 0, kR64F = 1, kR16F = 2, kR16BF = 14;   // cudaDataType_t
inline constexpr int kCompute32F = 68;                                // CUBLAS_COMPUTE_32F
inline constexpr int kEpDefault = 1, kEpBias = 4, kEpGelu = 32, kEpGeluBias = 36, kEpGeluAuxBias = 164;
}  // namespace lt_const

}  // namespace tessel::kernels::cuda
