#pragma once
// The interface every reference model implements, and the factory.
#include <memory>

#include "models/config.h"
#include "nn/container.h"
#include "nn/module.h"
#include "nn/staged.h"
#include "runtime/tensor.h"

namespace tessel::models {

// A language model is a staged model (nn/staged.h) whose input is token ids
// [B, T] (int64, T <= max_seq_len), whose output is logits [B, T, vocab]
// (float32 under bf16 autocast too) and whose loss is the mean next-token
// cross-entropy. forward(), loss() and aux_loss() are nn::StagedModel's:
// loss(logits, targets) = token_loss + aux_loss() x aux_loss_coef in training.
class LanguageModel : public nn::StagedModel {
 public:
  LanguageModel(std::string type_name, ModelConfig config)
      : nn::StagedModel(std::move(type_name)), config(std::move(config)) {}

  // The stages (nn::StagedModel's; a model's code lives in them): embed: ids
  // [B, T] -> hidden [B, T, dim]; blocks: hidden -> hidden, in order; head:
  // hidden -> logits.
  // Mean next-token cross-entropy of logits [B, T, V] against targets [B, T]
  // (the loss without auxiliary losses).
  Tensor token_loss(const Tensor& logits, const Tensor& targets) const;
  Tensor stage_loss(const Tensor& logits, const Tensor& targets) override { return token_loss(logits, targets); }
  // Mixtral's router load-balancing loss weight (config.aux_loss_coef).
  double aux_loss_coef() const override { return config.aux_loss_coef; }
  // Token ids [1, 1] on Meta.
  Tensor example_input() const override;
  // Tokens routed to each expert in the last forward, summed over layers (MoE only).
  virtual std::vector<int64_t> expert_counts() const { return {}; }

  const ModelConfig config;
};

// Builds a model on the current nn::ConstructionScope device (Meta for
// planning) with paths assigned; parameters are uninitialised until
// reset_parameters(seed).
std::shared_ptr<LanguageModel> build_model(const ModelConfig& config);

// Convenience for eager use: build on CPU and initialise from `seed`.
std::shared_ptr<LanguageModel> make_language_model(const ModelConfig& config, uint64_t seed);
// The same on `device` (a GPU): built on Meta, materialised there and
// initialised from `seed` -- the CPU build's values (Philox: the same bits
// on every device).
std::shared_ptr<LanguageModel> make_language_model(const ModelConfig& config, uint64_t seed, Device device);

}  // namespace tessel::models
