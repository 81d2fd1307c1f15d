#pragma once
// Dropout, shard-invariant (nn/context.h).
#include "nn/container.h"

namespace tessel::nn {

// Zeroes each element with probability p and scales the rest by 1/(1-p) in
// training mode; the identity (returns x itself) in eval mode or when p == 0.
//
// The mask is drawn with key {seed, stream_for(path(), {step})} from the
// forward context, at the input's coordinates in the global batch (dim 0 is
// the batch: ForwardContext::batch_offset / global_batch), so a micro-batch or
// a data-parallel rank gets exactly its slice of the full-batch mask.
//
// One instance is meant to be used once per forward: the mask depends on the
// module's path and the step, not on a call counter, so calling the same
// Dropout twice in one step on same-shaped inputs draws the same mask. Use one
// Dropout module per site. Dim 0 of the input must be the batch dimension the
// forward context describes (not a flattened [B*T, C] under a micro-batch
// context).
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  const double p;
};

}  // namespace tessel::nn
