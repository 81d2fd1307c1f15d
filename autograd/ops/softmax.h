#pragma once
// Differentiable softmax and log-softmax along one dimension. Order of
// operations and the canonical sum over `dim`: kernels/softmax.h.
#include <cstdint>

#include "runtime/tensor.h"

namespace tessel {

// exp(x - max) / sum(exp(x - max)) along dim. Floating inputs only; the
// result has x's dtype (16-bit inputs compute in float32, rounded once).
Tensor softmax(const Tensor& x, int64_t dim);
// (x - max) - log(sum(exp(x - max))) along dim.
Tensor log_softmax(const Tensor& x, int64_t dim);

}  // namespace tessel
