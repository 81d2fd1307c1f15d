#pragma once
// Mixed-precision support kernels: the gradient unscale with the inf/NaN check
// behind nn::GradScaler (nn/grad_scaler.h).
#include "kernels/registry.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

// In place: x = x * inv_scale (computed in float, rounded once to x's dtype:
// float32, bfloat16 or float16; any strides). found_inf is one float32
// element on x's device: set to 1 when an element of x (before scaling) is
// inf or NaN, left unchanged otherwise -- so one found_inf can collect the
// check over many tensors. Deterministic: the flag only ever goes 0 -> 1.
inline KernelTable<void(const Tensor& x, const Tensor& found_inf, float inv_scale)> amp_unscale{"amp_unscale"};

}  // namespace tessel::kernels
