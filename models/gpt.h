#pragma once
// NanoGPT: the GPT-2 architecture (learned positions, pre-LayerNorm blocks,
// GELU MLP, tied input/output embeddings).
//
// Parameter paths: wte.weight, wpe.weight, layers.{i}.ln_1.{weight,bias},
// layers.{i}.attn.{wq,wk,wv,wo}.{weight,bias}, layers.{i}.ln_2.*,
// layers.{i}.mlp.{fc,proj}.{weight,bias}, ln_f.{weight,bias}. The LM head is
// wte (tied).
#include "models/language_model.h"
#include "nn/nn.h"

namespace tessel::models {

class GPTBlock : public nn::UnaryModule {
 public:
  explicit GPTBlock(const ModelConfig& c);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<nn::LayerNorm> ln_1, ln_2;
  std::shared_ptr<nn::Attention> attn;
  std::shared_ptr<nn::MLP> mlp;
};

class GPT : public LanguageModel {
 public:
  explicit GPT(const ModelConfig& config);
  Tensor embed(const Tensor& ids) override;
  Tensor head(const Tensor& h) override;
  const std::vector<std::shared_ptr<nn::UnaryModule>>& blocks() const override { return blocks_; }

  std::shared_ptr<nn::Embedding> wte, wpe;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::ModuleList> layers;
  std::shared_ptr<nn::LayerNorm> ln_f;

 private:
  std::vector<std::shared_ptr<nn::UnaryModule>> blocks_;
};

}  // namespace tessel::models
