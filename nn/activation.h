#pragma once
// Activation modules (no parameters), for Sequential.
#include <string>

#include "nn/container.h"

namespace tessel::nn {

// gelu(x, approximate): "tanh" (GPT-2, the default) or "none" (erf).
class GELU : public UnaryModule {
 public:
  explicit GELU(std::string approximate = "tanh");
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const std::string approximate;
};

// x * sigmoid(x).
class SiLU : public UnaryModule {
 public:
  SiLU() : UnaryModule("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

}  // namespace tessel::nn
