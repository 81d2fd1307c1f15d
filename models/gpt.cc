#include "models/gpt.h"

#include <cmath>

#include "autograd/api.h"
#include "nn/kv_cache.h"

namespace tessel::models {

GPTBlock::GPTBlock(const ModelConfig& c) : nn::UnaryModule("GPTBlock") {
  ln_1 = child("ln_1", std::make_shared<nn::LayerNorm>(c.dim, c.norm_eps));
  nn::AttentionConfig ac;
  ac.dim = c.dim;
  ac.n_head = c.n_head;
  ac.bias = c.bias;
  ac.attn_dropout = c.dropout;
  ac.resid_dropout = c.dropout;
  attn = child("attn", std::make_shared<nn::Attention>(ac));
  ln_2 = child("ln_2", std::make_shared<nn::LayerNorm>(c.dim, c.norm_eps));
  mlp = child("mlp", std::make_shared<nn::MLP>(c.dim, c.hidden, c.bias, c.dropout));
}

Tensor GPTBlock::forward(const Tensor& x) {
  Tensor h = x + (*attn)((*ln_1)(x));
  return h + (*mlp)((*ln_2)(h));
}

GPT::GPT(const ModelConfig& cfg) : LanguageModel("GPT", cfg.resolved()) {
  const ModelConfig& c = config;
  wte = child("wte", std::make_shared<nn::Embedding>(c.vocab_size, c.dim));
  wpe = child("wpe", std::make_shared<nn::Embedding>(c.max_seq_len, c.dim));
  drop = child("drop", std::make_shared<nn::Dropout>(c.dropout));
  layers = child("layers", std::make_shared<nn::ModuleList>());
  for (int64_t i = 0; i < c.n_layer; ++i) {
    blocks_.push_back(std::make_shared<GPTBlock>(c));
    layers->push_back(blocks_.back());
  }
  ln_f = child("ln_f", std::make_shared<nn::LayerNorm>(c.dim, c.norm_eps));
  TESSEL_CHECK(c.tie_embeddings, "nanogpt", "GPT-2 ties its input and output embeddings (tie_embeddings = true)");

  // GPT-2 initialisation: N(0, 0.02) for weights, zero biases, and the
  // residual projections scaled by 1/sqrt(2 * n_layer).
  const double std = c.init_std, resid_std = c.init_std / std::sqrt(2.0 * double(c.n_layer));
  for (auto& [path, slot] : parameter_slots()) {
    const bool is_bias = path.size() >= 5 && path.compare(path.size() - 5, 5, ".bias") == 0;
    const bool is_norm = path.find("ln_") != std::string::npos;
    if (is_norm) continue;  // LayerNorm keeps ones/zeros
    if (is_bias) {
      set_init(path, nn::init::zeros());
    } else if (path.find(".attn.wo.weight") != std::string::npos || path.find(".mlp.proj.weight") != std::string::npos) {
      set_init(path, nn::init::normal(0.0, resid_std));
    } else {
      set_init(path, nn::init::normal(0.0, std));
    }
  }
}

Tensor GPT::embed(const Tensor& ids) {
  TESSEL_CHECK(ids.dim() == 2, "nanogpt", "expects token ids [B, T], got {}", ids.desc());
  const int64_t T = ids.size(1);
  // Under a KV cache in eval mode (nn/kv_cache.h) the tokens continue the cached ones.
  const nn::KVCache* cache = is_training() ? nullptr : nn::current_kv_cache();
  const int64_t past = cache ? cache->position() : 0;
  TESSEL_CHECK(T <= config.max_seq_len, "nanogpt", "sequence length {} exceeds the context {} of config '{}'", T,
               config.max_seq_len, config.name);
  TESSEL_CHECK(past + T <= config.max_seq_len, "nanogpt",
               "positions {}..{} (after {} cached tokens) exceed the context {} of config '{}'", past, past + T - 1,
               past, config.max_seq_len, config.name);
  Tensor pos = arange(past, past + T).to(ids.device());
  return (*drop)((*wte)(ids) + (*wpe)(pos));
}

Tensor GPT::head(const Tensor& h) {
  Tensor x = (*ln_f)(nn::head_positions(*this, h));
  return nn::cast_up(linear(nn::cast_to_compute(x), nn::cast_to_compute(wte->weight)));  // tied LM head
}

}  // namespace tessel::models
