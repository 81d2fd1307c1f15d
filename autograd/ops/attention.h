#pragma once
// Scaled dot-product attention.
#include <optional>

#include "runtime/global_block.h"
#include "runtime/philox.h"
#include "runtime/tensor.h"

namespace tessel {

struct AttentionOptions {
  bool causal = true;           // query i attends to keys j <= i (needs T_q == T_k)
  std::optional<double> scale;  // default 1/sqrt(head_dim)
  double dropout_p = 0.0;       // dropout on the attention probabilities
  PhiloxKey dropout_key{};      // required when dropout_p > 0
  GlobalBlock dropout_block;    // where the [B, H, Tq, Tk] probabilities sit in the global ones (empty: whole)
  Tensor mask;                  // optional bool mask broadcastable to [B, H, T_q, T_k]; true = attend
};

// q: [B, Hq, Tq, D], k and v: [B, Hkv, Tk, D] with Hq a multiple of Hkv
// (grouped-query attention: query head h reads kv head h / (Hq / Hkv)).
// Returns [B, Hq, Tq, D]. Composed of differentiable ops, so every reduction
// (scores over D, softmax over keys, the weighted sum over keys, and the
// gradients' sums over the group of query heads sharing a kv head) follows
// the canonical order.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& opts = {});

}  // namespace tessel
