#pragma once
// Differentiable LayerNorm and RMSNorm over the trailing `normalized_shape`
// dims. Order of operations, and the canonical sums (over features for the
// statistics, over tokens for the weight/bias gradients): kernels/norm.h.
#include "runtime/tensor.h"

namespace tessel {

// (x - mean) / sqrt(var + eps) * weight + bias, statistics over the trailing
// dims given by normalized_shape (population variance). weight and bias are
// optional (undefined Tensor), with shape normalized_shape and x's dtype.
// The input is made contiguous first (a copy when it is not).
Tensor layer_norm(const Tensor& x, const Dims& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
// x / sqrt(mean(x^2) + eps) * weight (LLaMA), weight optional.
Tensor rms_norm(const Tensor& x, const Dims& normalized_shape, const Tensor& weight = Tensor(), double eps = 1e-6);

}  // namespace tessel
