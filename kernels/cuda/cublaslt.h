#pragma once
// cuBLASLt for fast-mode matmuls (numerics::GemmMode::Fast; docs/cuda.md):
// tensor cores for bfloat16/float16, float32 accumulation, optional bias /
// GELU epilogues. Run-to-run deterministic: lt_plan.h lists the choices.
#include "kernels/cuda/call.h"
#include "kernels/cuda/lt_plan.h"
#include "runtime/tensor.h"

namespace tessel::kernels::cuda {

// Runs `plan` (plan.ok) on the call's stream: out = epilogue(a . b + beta*out)
// with beta = accumulate ? 1 : 0. bias: [N] of the output dtype (Bias/Gelu*
// epilogues); aux: GeluAuxBias's pre-activation, ld aux_ld (>= N). Returns
// false (having done nothing) when cuBLASLt has no algorithm for the problem.
bool lt_matmul(const CudaCall& call, const LtPlan& plan, const void* a, const void* b, void* out, bool accumulate,
               const void* bias = nullptr, void* aux = nullptr, int64_t aux_ld = 0);

// out [M, N] = epilogue(x [M, K] . w^T + bias) with w [N, K] (a Linear's
// weight), all CUDA tensors of one dtype (float32/bfloat16/float16), x and w
// with a unit stride in one dim, out contiguous. Returns false when the
// layout or cuBLASLt does not allow it (nothing written).
bool lt_linear(const Tensor& x, const Tensor& w, const Tensor& bias, LtEpilogue epilogue, const Tensor& out,
               const Tensor& aux = Tensor());

}  // namespace tessel::kernels::cuda
