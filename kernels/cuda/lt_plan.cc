#include "kernels/cuda/lt_plan.h"

#include <algorithm>

namespace tessel::kernels::cuda {
namespace {

// A row-major-indexed operand X (r x c: X[i, j] at i * rs + j * cs) as the
// column-major stored matrix cuBLASLt reads with op(X^T)... i.e. we describe
// X^T (c x r). Rows contiguous (cs == 1): stored as is, c x r with ld = rs,
// op N. Columns contiguous (rs == 1): stored r x c with ld = cs, op T.
bool describe(int64_t r, int64_t c, int64_t rs, int64_t cs, int64_t bs, int64_t batch, LtOperand* out) {
  if (cs == 1 || c == 1) {
    // X[i, j] at i * rs + j: column-major (c x r) with ld = rs.
    const int64_t ld = r == 1 ? std::max<int64_t>(c, 1) : rs;
    if (ld < std::max<int64_t>(c, 1)) return false;
    *out = {false, c, r, ld, batch > 1 ? bs : 0};
    return true;
  }
  if (rs == 1 || r == 1) {
    // X[i, j] at i + j * cs: column-major (r x c) with ld = cs, read transposed.
    const int64_t ld = c == 1 ? std::max<int64_t>(r, 1) : cs;
    if (ld < std::max<int64_t>(r, 1)) return false;
    *out = {true, r, c, ld, batch > 1 ? bs : 0};
    return true;
  }
  return false;
}

int data_type_of(DType t) {
  switch (t) {
    case DType::Float32: return lt_const::kR32F;
    case DType::BFloat16: return lt_const::kR16BF;
    case DType::Float16: return lt_const::kR16F;
    default: return -1;
  }
}

int epilogue_code(LtEpilogue e) {
  switch (e) {
    case LtEpilogue::None: return lt_const::kEpDefault;
    case LtEpilogue::Bias: return lt_const::kEpBias;
    case LtEpilogue::Gelu: return lt_const::kEpGelu;
    case LtEpilogue::GeluBias: return lt_const::kEpGeluBias;
    case LtEpilogue::GeluAuxBias: return lt_const::kEpGeluAuxBias;
  }
  return lt_const::kEpDefault;
}

}  // namespace

LtPlan plan_lt_matmul(int64_t M, int64_t N, int64_t K, int64_t batch, int64_t a_rs, int64_t a_cs, int64_t a_bs,
                      int64_t b_rs, int64_t b_cs, int64_t b_bs, int64_t c_rs, int64_t c_bs, DType dtype,
                      LtEpilogue epilogue) {
  LtPlan p;
  p.data_type = data_type_of(dtype);
  if (p.data_type < 0) {
    p.why = "cuBLASLt path takes float32, bfloat16 or float16";
    return p;
  }
  if (M <= 0 || N <= 0 || K <= 0 || batch <= 0) {
    p.why = "empty problem";
    return p;
  }
  if (batch > 1 && (a_bs == 0 || b_bs == 0)) {
    p.why = "broadcast batch operand";
    return p;
  }
  // cuBLASLt's A = tessel b (K x N), described as its transpose (N x K).
  if (!describe(K, N, b_rs, b_cs, b_bs, batch, &p.a)) {
    p.why = "right operand has no unit stride";
    return p;
  }
  // cuBLASLt's B = tessel a (M x K), described as its transpose (K x M).
  if (!describe(M, K, a_rs, a_cs, a_bs, batch, &p.b)) {
    p.why = "left operand has no unit stride";
    return p;
  }
  // D = out^T: column-major N x M with ld = c_rs (out has unit column stride).
  const int64_t ldc = M == 1 ? N : c_rs;
  if (ldc < N) {
    p.why = "output rows overlap";
    return p;
  }
  p.d = {false, N, M, ldc, batch > 1 ? c_bs : 0};
  p.m = N;
  p.n = M;
  p.k = K;
  p.batch = batch;
  p.compute_type = lt_const::kCompute32F;
  p.scale_type = lt_const::kR32F;
  p.epilogue = epilogue_code(epilogue);
  p.ok = true;
  return p;
}

}  // namespace tessel::kernels::cuda
