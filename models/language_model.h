#pragma once
// The interface every reference model implements, and the factory.
#include <memory>

#include "models/config.h"
#include "nn/container.h"
#include "nn/module.h"
#include "runtime/tensor.h"

namespace tessel::models {

class LanguageModel : public nn::Module {
 public:
  LanguageModel(std::string type_name, ModelConfig config)
      : nn::Module(std::move(type_name)), config(std::move(config)) {}

  // ids [B, T] (int64, T <= max_seq_len) -> logits [B, T, vocab] (float32
  // under bf16 autocast too): head(blocks(embed(ids))), each block called
  // through its forward hooks. The model's own forward hooks run around it
  // (it is the root module; FSDP gathers the non-block parameters there).
  virtual Tensor forward(const Tensor& ids);

  // The model as a chain of stages (pipeline parallelism splits it here):
  // embed: ids [B, T] -> hidden [B, T, dim]; blocks: hidden -> hidden, in
  // order; head: hidden -> logits. A model's code lives in these.
  virtual Tensor embed(const Tensor& ids) = 0;
  virtual const std::vector<std::shared_ptr<nn::UnaryModule>>& blocks() const = 0;
  virtual Tensor head(const Tensor& h) = 0;
  // Mean next-token cross-entropy of logits [B, T, V] against targets [B, T],
  // plus any auxiliary loss the last forward produced (Mixtral's router
  // load-balancing loss times aux_loss_coef).
  virtual Tensor loss(const Tensor& logits, const Tensor& targets);
  // The cross-entropy part of loss() alone (pipeline stages add each block's
  // auxiliary loss where the block runs: see block_aux_loss).
  Tensor token_loss(const Tensor& logits, const Tensor& targets) const;
  // The auxiliary loss of the last forward (undefined when none).
  virtual Tensor aux_loss() const { return Tensor(); }
  // The auxiliary loss block i produced in its last forward (undefined when
  // none); aux_loss() is their sum over the blocks.
  virtual Tensor block_aux_loss(size_t /*i*/) const { return Tensor(); }
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

}  // namespace tessel::models
