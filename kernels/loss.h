#pragma once
// Classification losses over the last dimension: cross-entropy fused with
// log-softmax, and the negative log-likelihood of log-probabilities.
//
// Layout: logits / log-probs are contiguous [M, K] (M tokens, K classes; the
// op flattens leading dims); targets are contiguous int64 [M]. Per-token
// outputs (losses, row_max, sum_exp) are contiguous [M] in the compute dtype C
// (float32 for 16/32-bit inputs, float64 for float64); count is an int64
// scalar. Targets equal to ignore_index are skipped; any other target outside
// [0, K) is an error (check_targets, run by the op before the kernels).
//
// Order of operations (the contract for every backend), per token r with
// target t and logits x_i widened to C, V = `chunks`, eps = label_smoothing
// rounded to C:
//
//   cross_entropy forward
//     m   = max_i x_i                 (as in kernels/softmax.h: a value, +0 for a zero max)
//     s   = canonical_sum_V(tmath::exp(x_i - m))
//     L   = tmath::log(s)
//     nll = L - (x_t - m)
//     loss = nll                                              when eps == 0
//     loss = (C(1) - eps) * nll + (eps / C(K)) * S            when eps > 0, with
//            S = canonical_sum_V(L - (x_i - m))   (the sum of -log p_i)
//     row_max[r] = m, sum_exp[r] = s are saved for backward.
//   cross_entropy backward
//     p_i  = tmath::exp(x_i - m) * (C(1) / s)                 (the bits of softmax's forward)
//     q_i  = (C(1) - eps) + eps / C(K)  if i == t, else  eps / C(K)
//     dx_i = (p_i - q_i) * scale
//   nll_loss forward:  loss = -x_t
//   nll_loss backward: dx_i = -scale if i == t, else +0
//   with scale = g[r] (reduction "none"), g / C(count) ("mean"), g ("sum").
//   Ignored tokens: loss = +0 (row_max = sum_exp = 0) and dx_i = +0.
//
//   loss_reduce (the loss over tokens, M being a dimension a distributed run
//   shards): "sum" = canonical_sum_V(loss_0 .. loss_{M-1}) over all tokens in
//   order (ignored ones contribute +0); "mean" = that sum / C(count), NaN
//   when every target is ignored (0 / 0, as in PyTorch). Rounded once to the
//   output dtype.
#include <cstdint>

#include "kernels/registry.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

enum class LossReduction : uint8_t { None, Mean, Sum };

// Throws tessel::Error naming `op`, the first offending target, its position
// and the valid range, if a target is neither ignore_index nor in [0, K).
inline KernelTable<void(const Tensor& targets, int64_t num_classes, int64_t ignore_index, const char* op)>
    check_targets{"check_targets"};

inline KernelTable<void(const Tensor& logits, const Tensor& targets, int64_t ignore_index, double label_smoothing,
                        const Tensor& losses, const Tensor& row_max, const Tensor& sum_exp, const Tensor& count,
                        int chunks)>
    cross_entropy_forward{"cross_entropy_forward"};
// g: [M] for reduction None, a scalar otherwise, in C's dtype. dlogits: logits' shape and dtype.
inline KernelTable<void(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                        const Tensor& sum_exp, const Tensor& count, int64_t ignore_index, double label_smoothing,
                        LossReduction reduction, const Tensor& dlogits)>
    cross_entropy_backward{"cross_entropy_backward"};

inline KernelTable<void(const Tensor& logp, const Tensor& targets, int64_t ignore_index, const Tensor& losses,
                        const Tensor& count)>
    nll_loss_forward{"nll_loss_forward"};
inline KernelTable<void(const Tensor& g, const Tensor& targets, const Tensor& count, int64_t ignore_index,
                        LossReduction reduction, const Tensor& dlogp)>
    nll_loss_backward{"nll_loss_backward"};

// out (a scalar of any floating dtype) = sum or mean of losses ([M], C dtype).
inline KernelTable<void(const Tensor& losses, const Tensor& count, bool mean, const Tensor& out, int chunks)>
    loss_reduce{"loss_reduce"};

}  // namespace tessel::kernels
