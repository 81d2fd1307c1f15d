#pragma once
// Feed-forward blocks: MLP (GPT-2) and SwiGLU (LLaMA / Mixtral experts).
#include <cstdint>
#include <memory>

#include "nn/dropout.h"
#include "nn/linear.h"

namespace tessel::nn {

// GPT-2's MLP: drop(proj(gelu_tanh(fc(x)))), x [..., dim] -> [..., dim].
// fc: Linear(dim, hidden, bias), proj: Linear(hidden, dim, bias),
// drop: Dropout(dropout). hidden = 0 means 4 * dim.
class MLP : public UnaryModule {
 public:
  explicit MLP(int64_t dim, int64_t hidden = 0, bool bias = true, double dropout = 0.0);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const int64_t dim, hidden;
  std::shared_ptr<Linear> fc, proj;
  std::shared_ptr<Dropout> drop;
};

// LLaMA's feed-forward: w2(silu(w1 x) * w3 x), no biases.
// w1 (gate) and w3 (up): Linear(dim, hidden), w2 (down): Linear(hidden, dim).
class SwiGLU : public UnaryModule {
 public:
  SwiGLU(int64_t dim, int64_t hidden);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const int64_t dim, hidden;
  std::shared_ptr<Linear> w1, w2, w3;
};

}  // namespace tessel::nn
