#include "models/llama.h"

#include <cmath>

#include "autograd/api.h"
#include "nn/kv_cache.h"

namespace tessel::models {

LlamaBlock::LlamaBlock(const ModelConfig& c) : nn::UnaryModule("LlamaBlock") {
  attn_norm = child("attn_norm", std::make_shared<nn::RMSNorm>(c.dim, c.norm_eps));
  nn::AttentionConfig ac;
  ac.dim = c.dim;
  ac.n_head = c.n_head;
  ac.n_kv_head = c.n_kv_head;
  ac.bias = false;
  ac.rope = true;
  ac.rope_theta = c.rope_theta;
  ac.max_seq_len = c.max_seq_len;
  attn = child("attn", std::make_shared<nn::Attention>(ac));
  ffn_norm = child("ffn_norm", std::make_shared<nn::RMSNorm>(c.dim, c.norm_eps));
  if (c.arch == Arch::Mixtral) {
    nn::MoEConfig mc;
    mc.dim = c.dim;
    mc.hidden = c.hidden;
    mc.num_experts = c.num_experts;
    mc.top_k = c.top_k;
    moe = child("ffn", std::make_shared<nn::MoE>(mc));
    ffn = moe;
  } else {
    ffn = child("ffn", std::make_shared<nn::SwiGLU>(c.dim, c.hidden));
  }
}

Tensor LlamaBlock::forward(const Tensor& x) {
  Tensor h = x + (*attn)((*attn_norm)(x));
  return h + (*ffn)((*ffn_norm)(h));
}

Llama::Llama(const ModelConfig& cfg)
    : LanguageModel(cfg.arch == Arch::Mixtral ? "Mixtral" : "Llama", cfg.resolved()) {
  const ModelConfig& c = config;
  TESSEL_CHECK(c.arch != Arch::NanoGPT, "llama", "config '{}' is a NanoGPT config", c.name);
  tok_embeddings = child("tok_embeddings", std::make_shared<nn::Embedding>(c.vocab_size, c.dim));
  layers = child("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.n_layer; ++i) {
    llama_blocks_.push_back(std::make_shared<LlamaBlock>(c));
    blocks_.push_back(llama_blocks_.back());
    layers->push_back(blocks_.back());
  }
  norm = child("norm", std::make_shared<nn::RMSNorm>(c.dim, c.norm_eps));
  output = child("output", std::make_shared<nn::Linear>(c.dim, c.vocab_size, /*bias=*/false));

  // N(0, 0.02) for every matrix; the residual outputs (wo, w2) scaled by
  // 1/sqrt(2 * n_layer); norms keep ones.
  const double std = c.init_std, resid_std = c.init_std / std::sqrt(2.0 * double(c.n_layer));
  for (auto& [path, slot] : parameter_slots()) {
    if (path.find("norm") != std::string::npos) continue;
    const bool resid = path.find(".attn.wo.") != std::string::npos || path.find(".w2.") != std::string::npos;
    set_init(path, nn::init::normal(0.0, resid ? resid_std : std));
  }
}

Tensor Llama::embed(const Tensor& ids) {
  const char* who = config.arch == Arch::Mixtral ? "mixtral" : "llama";
  TESSEL_CHECK(ids.dim() == 2, who, "expects token ids [B, T], got {}", ids.desc());
  TESSEL_CHECK(ids.size(1) <= config.max_seq_len, who, "sequence length {} exceeds the context {} of config '{}'",
               ids.size(1), config.max_seq_len, config.name);
  return (*tok_embeddings)(ids);
}

Tensor Llama::head(const Tensor& h) { return nn::cast_up((*output)((*norm)(nn::head_positions(*this, h)))); }

Tensor Llama::block_aux_loss(size_t i) const {
  if (config.arch != Arch::Mixtral) return Tensor();
  TESSEL_CHECK(i < llama_blocks_.size(), "mixtral", "block {} of {}", i, llama_blocks_.size());
  return llama_blocks_[i]->moe->last_aux_loss();
}

std::vector<int64_t> Llama::expert_counts() const {
  std::vector<int64_t> counts;
  if (config.arch != Arch::Mixtral) return counts;
  for (const auto& b : llama_blocks_) {
    const auto& c = b->moe->last_expert_counts();
    if (counts.empty()) counts.assign(c.size(), 0);
    for (size_t e = 0; e < c.size() && e < counts.size(); ++e) counts[e] += c[e];
  }
  return counts;
}

}  // namespace tessel::models
