#pragma once
// Linear and Embedding.
#include <cstdint>

#include "nn/container.h"

namespace tessel::nn {

// y = x · weightᵀ + bias, x [..., in] -> [..., out].
// weight [out, in]: kaiming_uniform(a = sqrt(5)) (PyTorch's default, i.e.
// U(±1/sqrt(in))); bias [out]: U(±1/sqrt(in)). Change either with set_init.
// Under AutocastScope(c), x, weight and bias are cast to c (nn/autocast.h).
class Linear : public UnaryModule {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const int64_t in_features, out_features;
  Tensor weight;  // [out, in]
  Tensor bias;    // [out]; undefined without bias
};

// out[..., :] = weight[ids[...], :], ids int32/int64 [...] -> [..., dim].
// weight [num, dim]: normal(0, 1) by default (PyTorch), or `init`.
// Runs in the weight's dtype (not autocast).
class Embedding : public UnaryModule {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, InitFn init = nullptr);
  Tensor forward(const Tensor& ids) override;
  std::string extra_repr() const override;

  const int64_t num_embeddings, embedding_dim;
  Tensor weight;  // [num, dim]
};

}  // namespace tessel::nn
