#pragma once
// Causal self-attention with separate q/k/v/o projections, grouped-query
// heads, optional rotary embeddings and dropout.
#include <cstdint>
#include <memory>

#include "nn/dropout.h"
#include "nn/linear.h"

namespace tessel::nn {

struct AttentionConfig {
  int64_t dim = 0;                // model width C
  int64_t n_head = 0;             // query heads
  int64_t n_kv_head = 0;          // key/value heads; 0: n_head (multi-head), fewer: grouped-query attention
  int64_t head_dim = 0;           // 0: dim / n_head
  bool bias = false;              // biases on wq, wk, wv, wo (GPT-2: true, LLaMA: false)
  bool rope = false;              // rotary embeddings on q and k
  double rope_theta = 10000.0;
  bool rope_interleaved = false;  // false: rotate_half pairs (i, i + D/2) (LLaMA/HF); true: (2i, 2i + 1)
  int64_t max_seq_len = 0;        // rows of the RoPE tables (position_offset + T must fit); needed with rope
  double attn_dropout = 0.0;      // on the attention probabilities
  double resid_dropout = 0.0;     // on the output projection
};

// forward(x [B, T, dim], position_offset) -> [B, T, dim]:
//   q = wq(x) as [B, T, n_head, head_dim], k = wk(x), v = wv(x) as [B, T, n_kv_head, head_dim]
//   (rope) q, k = apply_rotary(q/k, rope_cos, rope_sin, position_offset, rope_interleaved)
//   y = scaled_dot_product_attention(q, k, v as [B, H, T, D], causal, attn dropout)
//   out = resid_drop(wo(y as [B, T, n_head * head_dim]))
// position_offset shifts the rotary positions (tokens are at positions
// offset .. offset + T - 1); the causal mask is over the T given tokens.
// In eval mode under an nn::KVCacheScope (nn/kv_cache.h) the offset is the
// cache's position, k and v are appended to the cache, and the queries attend
// over every cached key (causally for the new ones).
//
// Attention-probability dropout draws with the site path() + ".attn_drop"
// (key {seed, stream_for(site, {step})}) at the probabilities' coordinates in
// the global batch ([B, H, T, T], dim 0 = batch): see nn/context.h. The
// residual dropout is the child Dropout "resid_drop".
//
// RoPE tables are non-persistent buffers rope_cos / rope_sin [max_seq_len,
// head_dim / 2] in the construction dtype (rope_cache: float64 host math,
// rounded once), computed at construction (Meta: shapes only) and again by
// init_buffers() after materialize().
class Attention : public UnaryModule {
 public:
  explicit Attention(const AttentionConfig& config);
  Tensor forward(const Tensor& x) override { return forward(x, 0); }
  Tensor forward(const Tensor& x, int64_t position_offset);
  void init_buffers() override;
  std::string extra_repr() const override;

  const AttentionConfig config;  // n_kv_head and head_dim resolved (never 0)
  std::shared_ptr<Linear> wq, wk, wv, wo;
  std::shared_ptr<Dropout> resid_drop;
  Tensor rope_cos, rope_sin;  // [max_seq_len, head_dim / 2]; undefined without rope

  // Selective activation recomputation (nn/recompute.h): the core (RoPE,
  // the fused attention, the head merge) keeps only q, k, v and runs again
  // in the backward. nn::apply_recompute sets it.
  void set_recompute_core(bool on) { recompute_core_ = on; }
  bool recompute_core() const { return recompute_core_; }

 private:
  bool recompute_core_ = false;
};

}  // namespace tessel::nn
