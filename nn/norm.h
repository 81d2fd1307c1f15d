#pragma once
// LayerNorm and RMSNorm over the last dimension.
//
// Both compute in float32 at least: a 16-bit input (or weight) is cast up
// first and the output is float32 (float64 models stay float64). The result's
// dtype is promote(x, weight) after that cast-up.
#include <cstdint>

#include "nn/container.h"

namespace tessel::nn {

// (x - mean) / sqrt(var + eps) * weight + bias over the last dim (size dim).
// affine = false: no weight and no bias; bias = false: weight only.
// weight init ones, bias zeros.
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(int64_t dim, double eps = 1e-5, bool affine = true, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const int64_t dim;
  const double eps;
  Tensor weight, bias;  // [dim] each, undefined when absent
};

// x / sqrt(mean(x^2) + eps) * weight over the last dim; weight init ones.
class RMSNorm : public UnaryModule {
 public:
  explicit RMSNorm(int64_t dim, double eps = 1e-6);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const int64_t dim;
  const double eps;
  Tensor weight;  // [dim]
};

}  // namespace tessel::nn
