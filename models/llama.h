#pragma once
// LLaMA (RMSNorm, RoPE, grouped-query attention, SwiGLU, untied LM head) and
// Mixtral (the same with sparse mixture-of-experts feed-forwards).
//
// Parameter paths: tok_embeddings.weight, layers.{i}.attn_norm.weight,
// layers.{i}.attn.{wq,wk,wv,wo}.weight, layers.{i}.ffn_norm.weight,
// layers.{i}.ffn.{w1,w2,w3}.weight (LLaMA) or layers.{i}.ffn.gate.weight and
// layers.{i}.ffn.experts.{e}.{w1,w2,w3}.weight (Mixtral), norm.weight,
// output.weight.
#include "models/language_model.h"
#include "nn/nn.h"

namespace tessel::models {

class LlamaBlock : public nn::UnaryModule {
 public:
  explicit LlamaBlock(const ModelConfig& c);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::RMSNorm> attn_norm, ffn_norm;
  std::shared_ptr<nn::Attention> attn;
  std::shared_ptr<nn::UnaryModule> ffn;  // SwiGLU or MoE
  std::shared_ptr<nn::MoE> moe;          // set for Mixtral blocks
};

class Llama : public LanguageModel {
 public:
  explicit Llama(const ModelConfig& config);
  Tensor embed(const Tensor& ids) override;
  Tensor head(const Tensor& h) override;
  const std::vector<std::shared_ptr<nn::UnaryModule>>& blocks() const override { return blocks_; }
  Tensor block_aux_loss(size_t i) const override;
  std::vector<int64_t> expert_counts() const override;

  std::shared_ptr<nn::Embedding> tok_embeddings;
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::RMSNorm> norm;
  std::shared_ptr<nn::Linear> output;

 private:
  std::vector<std::shared_ptr<nn::UnaryModule>> blocks_;
  std::vector<std::shared_ptr<LlamaBlock>> llama_blocks_;
};

}  // namespace tessel::models
