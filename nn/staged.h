#pragma once
// nn::StagedModel: a model written as a chain of stages,
//
//   output = head(blocks[n-1](... blocks[0](embed(input)) ...))
//
// which is all pipeline parallelism needs to cut it between ranks
// (nn/parallel/pipeline/, docs/parallel.md "Pipeline parallelism"): the
// first stage embeds the input, any contiguous run of blocks can run on any
// rank (hidden -> hidden), the last stage applies the head and the loss.
// models::LanguageModel is one; a user's model becomes pipelinable by
// deriving from this and putting its code in these pieces:
//
//   class Classifier : public nn::StagedModel {
//    public:
//     Classifier() : StagedModel("Classifier") {
//       proj = child("proj", std::make_shared<nn::Linear>(8, 32));
//       layers = child("layers", std::make_shared<nn::ModuleList>());
//       for (int i = 0; i < 4; ++i) { blocks_.push_back(std::make_shared<Residual>(32)); layers->push_back(blocks_.back()); }
//       out = child("out", std::make_shared<nn::Linear>(32, 10));
//     }
//     Tensor embed(const Tensor& x) override { return (*proj)(x); }
//     const std::vector<std::shared_ptr<nn::UnaryModule>>& blocks() const override { return blocks_; }
//     Tensor head(const Tensor& h) override { return (*out)(h); }
//     Tensor stage_loss(const Tensor& logits, const Tensor& y) override { return cross_entropy(logits, y); }
//     Tensor example_input() const override { return empty({1, 8}, TensorOptions().with_device(kMeta)); }
//     ...
//   };
//
// The one-device loop is then `loss(forward(x), y).backward()`; a pipeline
// runs exactly the same pieces, split over ranks, so it gives the same
// numbers (and in bitwise mode the same bits).
#include <memory>
#include <vector>

#include "nn/container.h"
#include "nn/module.h"
#include "runtime/tensor.h"

namespace tessel::nn {

class StagedModel : public Module {
 public:
  using Module::Module;

  // ---- the stages: a model's code lives in these -------------------------------------
  // First stage: a batch of inputs (any dtype and shape; dim 0 is the batch,
  // which data parallelism splits) -> hidden.
  virtual Tensor embed(const Tensor& input) = 0;
  // The blocks, hidden -> hidden, in the order they run. Each is called
  // through its forward hooks ((*block)(h)), so plans and FSDP can wrap it.
  // Every block must be a submodule of this model: a pipeline assigns the
  // parameters under a block's module to the stage that runs the block.
  virtual const std::vector<std::shared_ptr<UnaryModule>>& blocks() const = 0;
  // Last stage: hidden -> output (e.g. logits).
  virtual Tensor head(const Tensor& h) = 0;
  // The loss of `output` against `target`, without the blocks' auxiliary
  // losses (a pipeline adds those on the stage where each block runs).
  virtual Tensor stage_loss(const Tensor& output, const Tensor& target) = 0;
  // The auxiliary loss block i produced in its last forward (Mixtral's
  // router load-balancing loss), undefined when none; it counts in the loss
  // times aux_loss_coef().
  virtual Tensor block_aux_loss(size_t /*i*/) const { return Tensor(); }
  // block_aux_loss(i) as the loss adds it: an error when block i ran under
  // activation recomputation in grad mode, where its auxiliary loss was
  // recorded nowhere and would train without its gradient (nn/recompute.h).
  Tensor recorded_block_aux_loss(size_t i) const;
  virtual double aux_loss_coef() const { return 0.0; }
  // A Meta tensor shaped like a batch of ONE sample (a language model: int64
  // [1, 1]). A pipeline runs embed() on it and head() on embed's output, on
  // Meta (no values, no memory), to find which parameters the first and the
  // last stage use; its dtype and shape must be ones embed() accepts.
  virtual Tensor example_input() const = 0;

  // ---- the whole model on one device ---------------------------------------------------
  // head(blocks(embed(input))), each block through its forward hooks. The
  // model's own forward hooks run around it: it is the root, which nobody
  // calls through a parent (FSDP gathers the parameters outside the blocks
  // there). Not virtual: a pipeline runs the stages, never forward(), so a
  // model whose forward() did more would train differently when pipelined.
  Tensor forward(const Tensor& input);
  // What a training loop minimises: stage_loss(output, target) + aux_loss()
  // x aux_loss_coef() (in training mode, when some block produced an
  // auxiliary loss: an eval forward may produce none). A pipeline's bitwise
  // loss evaluates this same expression with the same ops.
  Tensor loss(const Tensor& output, const Tensor& target);
  // The blocks' auxiliary losses of the last forward summed in block order
  // (blocks without one skipped); undefined when no block produced one.
  Tensor aux_loss() const;
};

}  // namespace tessel::nn
