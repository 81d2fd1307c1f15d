#pragma once
// Differentiable classification losses over the last dimension. Order of
// operations, the canonical sums over classes and over tokens, and the
// treatment of ignored targets: kernels/loss.h.
#include <cstdint>
#include <string>

#include "runtime/tensor.h"

namespace tessel {

// Cross-entropy of logits [..., C] (class dim last) against int64 class
// indices targets [...], fused with log-softmax: no log-probabilities are
// materialised; backward produces dlogits = (softmax - target distribution) * g
// (/ count for "mean") directly.
//   ignore_index: targets equal to it contribute no loss and no gradient.
//   reduction: "mean" (over non-ignored targets; NaN when all are ignored, as
//     in PyTorch), "sum", or "none" (per-target losses, shape [...], 0 where
//     ignored).
//   label_smoothing in [0, 1]: target distribution (1 - eps) * onehot + eps / C.
// Any other target outside [0, C) raises tessel::Error naming the op, the
// value, its position and the valid range. The result has the logits' dtype
// (16-bit logits compute in float32 and round once).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100,
                     const std::string& reduction = "mean", double label_smoothing = 0.0);

// Negative log-likelihood of log-probabilities [..., C] (e.g. log_softmax
// output) at int64 targets [...]; ignore_index, reduction and target checks as
// cross_entropy.
Tensor nll_loss(const Tensor& log_probs, const Tensor& targets, int64_t ignore_index = -100,
                const std::string& reduction = "mean");

}  // namespace tessel
