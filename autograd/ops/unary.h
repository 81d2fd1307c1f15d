#pragma once
// Differentiable unary math and activations (formulas: kernels/unary_math.h).
#include "runtime/tensor.h"

namespace tessel {

Tensor neg(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sign(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor log1p(const Tensor& x);
Tensor expm1(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
// approximate = "tanh" (GPT-2) or "none" (exact, erf-based).
Tensor gelu(const Tensor& x, const std::string& approximate = "tanh");
Tensor silu(const Tensor& x);
Tensor square(const Tensor& x);
Tensor reciprocal(const Tensor& x);
Tensor erf(const Tensor& x);
Tensor floor(const Tensor& x);
Tensor ceil(const Tensor& x);
Tensor round(const Tensor& x);  // half to even
// silu(gate) * up — the SwiGLU feed-forward's gating.
Tensor swiglu(const Tensor& gate, const Tensor& up);

}  // namespace tessel
