#pragma once
// A model written the way a user writes one against tessel.h, for the
// training API's tests (test_run): a residual-MLP token classifier
//   Linear -> n x (LayerNorm, Linear, GELU, Linear, Dropout, + residual) -> LayerNorm -> Linear
// with `loss(x, y)` as its entry point (the root's forward hooks never run),
// blocks called either directly (`block->forward(h)`) or through their hooks
// (`(*block)(h)`), and synthetic data that is a pure function of (seed, step).
#include <memory>
#include <string>
#include <vector>

#include "tessel.h"

namespace tessel::testing {

struct MlpConfig {
  int64_t in = 12, dim = 16, classes = 5;
  int n_blocks = 2;
  double dropout = 0.1;
  bool call_blocks_through_hooks = false;  // (*block)(h) instead of block->forward(h)
};

class ResidualBlock : public nn::UnaryModule {
 public:
  ResidualBlock(int64_t dim, double dropout) : nn::UnaryModule("ResidualBlock") {
    norm = child("norm", std::make_shared<nn::LayerNorm>(dim));
    fc1 = child("fc1", std::make_shared<nn::Linear>(dim, 4 * dim));
    fc2 = child("fc2", std::make_shared<nn::Linear>(4 * dim, dim));
    drop = child("drop", std::make_shared<nn::Dropout>(dropout));
  }
  Tensor forward(const Tensor& x) override { return x + (*drop)((*fc2)(gelu((*fc1)((*norm)(x))))); }

  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> fc1, fc2;
  std::shared_ptr<nn::Dropout> drop;
};

class MlpClassifier : public nn::Module {
 public:
  explicit MlpClassifier(MlpConfig c) : nn::Module("MlpClassifier"), cfg(c) {
    embed = child("embed", std::make_shared<nn::Linear>(c.in, c.dim));
    auto list = child("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < c.n_blocks; ++i) {
      blocks.push_back(std::make_shared<ResidualBlock>(c.dim, c.dropout));
      list->push_back(blocks.back());
    }
    norm = child("norm", std::make_shared<nn::LayerNorm>(c.dim));
    head = child("head", std::make_shared<nn::Linear>(c.dim, c.classes));
  }
  Tensor logits(const Tensor& x) {
    Tensor h = embed->forward(x);
    for (auto& b : blocks) h = cfg.call_blocks_through_hooks ? (*b)(h) : b->forward(h);
    return head->forward(norm->forward(h));
  }
  Tensor loss(const Tensor& x, const Tensor& y) { return cross_entropy(nn::cast_up(logits(x)), y); }  // float32 loss under autocast

  MlpConfig cfg;
  std::shared_ptr<nn::Linear> embed, head;
  std::vector<std::shared_ptr<ResidualBlock>> blocks;
  std::shared_ptr<nn::LayerNorm> norm;
};

// The same network as a chain of stages (nn::StagedModel): pipelines can cut
// it; its loss is stage_loss(forward(x), y).
class StagedMlp : public nn::StagedModel {
 public:
  explicit StagedMlp(MlpConfig c) : nn::StagedModel("StagedMlp"), cfg(c) {
    embed_ = child("embed", std::make_shared<nn::Linear>(c.in, c.dim));
    auto list = child("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < c.n_blocks; ++i) {
      blocks_.push_back(std::make_shared<ResidualBlock>(c.dim, c.dropout));
      list->push_back(blocks_.back());
    }
    norm = child("norm", std::make_shared<nn::LayerNorm>(c.dim));
    head_ = child("head", std::make_shared<nn::Linear>(c.dim, c.classes));
  }
  Tensor embed(const Tensor& x) override { return (*embed_)(x); }
  const std::vector<std::shared_ptr<nn::UnaryModule>>& blocks() const override { return blocks_; }
  Tensor head(const Tensor& h) override { return (*head_)((*norm)(h)); }
  Tensor stage_loss(const Tensor& logits, const Tensor& y) override { return cross_entropy(nn::cast_up(logits), y); }
  Tensor example_input() const override { return empty({1, cfg.in}, TensorOptions().with_device(kMeta)); }

  MlpConfig cfg;
  std::shared_ptr<nn::Linear> embed_, head_;
  std::shared_ptr<nn::LayerNorm> norm;
  std::vector<std::shared_ptr<nn::UnaryModule>> blocks_;
};

// Megatron tensor parallelism for the blocks: fc1 column-, fc2 row-parallel.
inline parallel::ParallelPlan mlp_plan() {
  parallel::ParallelPlan plan;
  plan.name = "mlp-tp";
  plan.column_parallel("blocks\\.\\d+\\.fc1").row_parallel("blocks\\.\\d+\\.fc2");
  return plan;
}

// The global batch of step `step`: x ~ N(0, 1) [batch, in]; y = the argmax of
// a fixed random projection of x (a learnable rule). The same on every rank.
inline std::pair<Tensor, Tensor> mlp_batch(const MlpConfig& c, int64_t batch, uint64_t seed, int64_t step) {
  NoGradGuard ng;
  Tensor x = randn({batch, c.in}, PhiloxKey{seed, stream_for("data.x", {uint64_t(step)})});
  Tensor w = randn({c.in, c.classes}, PhiloxKey{seed, stream_for("data.rule")});
  return {x, argmax(matmul(x, w), 1)};
}

}  // namespace tessel::testing
