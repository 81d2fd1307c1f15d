#pragma once
// Mixed precision: a thread-local compute dtype for the matmuls.
//
//   nn::AutocastScope bf16(DType::BFloat16);
//   Tensor loss = cross_entropy(model->forward(x), y);   // matmuls in bf16
//   loss.backward();                                       // grads in float32
//
// Parameters stay in their own dtype (float32 master weights); nothing is
// converted in place. Inside a scope the layers cast, per call and
// differentiably (the cast's backward casts the gradient back), so every
// parameter gradient arrives in the parameter's dtype. Which op runs in which
// dtype under AutocastScope(c):
//
//   | layer / op                                  | runs in                                   |
//   |---------------------------------------------|-------------------------------------------|
//   | Linear (x, weight, bias cast to c)          | c (the GEMM accumulates in float32, rounds once) |
//   | Attention q/k/v/o projections (Linear)      | c                                         |
//   | RoPE (apply_rotary)                         | c storage, float32 arithmetic             |
//   | scaled_dot_product_attention: QKᵀ, P·V       | c                                         |
//   |   its softmax and probability dropout       | float32 arithmetic, probabilities stored in c |
//   | GELU / SiLU / swiglu / Dropout              | their input's dtype (c after a Linear), float32 arithmetic |
//   | LayerNorm / RMSNorm                         | float32 (16-bit inputs cast up; output float32) |
//   | MoE router (gate Linear, softmax, top-k),   | float32: the router runs outside autocast |
//   |   routing weights, combine, aux loss        |   (Switch Transformer's selective precision: |
//   |                                             |   routing must not flip with the dtype)   |
//   | Embedding                                   | the weight's dtype (float32)              |
//   | losses (cross_entropy on the caller's side) | call cast_up(logits) first: float32       |
//
// "float32 arithmetic" for 16-bit storage: tessel's kernels load 16-bit values
// into float, compute in float and round once on store. Residual additions of
// a float32 stream and a c output promote to float32. Float64 stays float64
// (cast_up leaves it alone), so gradient checks of float64 models are exact.
#include <optional>

#include "runtime/dtype.h"
#include "runtime/tensor.h"

namespace tessel::nn {

// Sets the compute dtype (a floating dtype) for its lifetime on this thread;
// nests, restoring the previous setting. AutocastScope off(std::nullopt)
// switches autocast off inside an autocast region.
class AutocastScope {
 public:
  explicit AutocastScope(std::optional<DType> compute);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  std::optional<DType> prev_;
};

// The compute dtype in effect, or nullopt outside any AutocastScope.
std::optional<DType> autocast_dtype();

// A floating tensor cast (differentiably) to the compute dtype when a scope is
// active; anything else is returned as is. Used for matmul operands.
Tensor cast_to_compute(const Tensor& t);
// A 16-bit floating tensor cast (differentiably) to float32; anything else
// (float32, float64, integers, undefined) is returned as is. Used for norms,
// softmaxes and losses.
Tensor cast_up(const Tensor& t);

}  // namespace tessel::nn
