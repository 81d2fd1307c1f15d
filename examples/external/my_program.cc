// A program in a Bazel workspace of its own that depends on tessel through
// local_repository (docs/build.md): a linear classifier trained on one device
// and on dp=2, with the same loop; in bitwise mode both end with the same bits.
// Then the same through forward_backward eager and compiled, and a staged
// model of its own on one device, compiled on dp=2 x pp=2, with its blocks
// compiled (mixed mode), and with them compiled under FSDP on dp=2.
#include <cstdio>

#include "tessel.h"
using namespace tessel;

struct Linear2 : nn::Module {
  std::shared_ptr<nn::Linear> fc;
  Linear2() : nn::Module("Linear2") { fc = child("fc", std::make_shared<nn::Linear>(8, 3)); }
  Tensor loss(const Tensor& x, const Tensor& y) { return cross_entropy((*fc)(x), y); }
};

std::string train(int ranks) {
  std::string hash;
  launch(ranks, [&](int rank) {
    auto model = nn::make_model<Linear2>();
    model->reset_parameters(1);
    MeshPtr mesh = ranks > 1 ? Mesh::world({{"dp", ranks}}) : nullptr;
    auto run = parallelize(model, mesh, parallel::builtin_plan("none"), adamw({0.1}));
    for (int64_t step = 0; step < 10; ++step) {
      Tensor x = randn({16, 8}, PhiloxKey{1, stream_for("x", {uint64_t(step)})});
      Tensor y = argmax(x.narrow(1, 0, 3), 1);
      run.model().loss(run.input(x), run.input(y)).backward();
      run.step_optimizer();
    }
    const std::string h = run.param_hash();
    if (rank == 0) hash = h;
  });
  return hash;
}

// The same training through forward_backward, eager or compiled
// (RunOptions::compile, docs/compile.md): the same bits.
std::string train_forward_backward(bool compile) {
  auto model = nn::make_model<Linear2>();
  model->reset_parameters(1);
  RunOptions o;
  o.compile = compile;
  auto run = parallelize(model, adamw({0.1}), o);
  for (int64_t step = 0; step < 10; ++step) {
    Tensor x = randn({16, 8}, PhiloxKey{1, stream_for("x", {uint64_t(step)})});
    run.forward_backward(x, argmax(x.narrow(1, 0, 3), 1));
    run.step_optimizer();
  }
  if (compile && run.compile_stats().replays != 7) return "not replayed: " + run.compile_stats().refused;
  return run.param_hash();
}

// A model of one's own as a chain of stages (docs/your_model.md, section
// 5), trained on one device eagerly and on dp=2 x pp=2 compiled: in
// bitwise mode the same bits, with the steps from the fourth on replayed.
struct Block : nn::UnaryModule {
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> fc1, fc2;
  explicit Block(int64_t d) : nn::UnaryModule("Block") {
    norm = child("norm", std::make_shared<nn::LayerNorm>(d));
    fc1 = child("fc1", std::make_shared<nn::Linear>(d, 4 * d));
    fc2 = child("fc2", std::make_shared<nn::Linear>(4 * d, d));
  }
  Tensor forward(const Tensor& x) override { return x + (*fc2)(gelu((*fc1)((*norm)(x)))); }
};

struct StagedClassifier : nn::StagedModel {
  std::shared_ptr<nn::Linear> in, out;
  std::vector<std::shared_ptr<nn::UnaryModule>> stack;
  StagedClassifier() : nn::StagedModel("StagedClassifier") {
    in = child("in", std::make_shared<nn::Linear>(12, 32));
    auto list = child("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 4; ++i) list->push_back(stack.emplace_back(std::make_shared<Block>(32)));
    out = child("out", std::make_shared<nn::Linear>(32, 5));
  }
  Tensor embed(const Tensor& x) override { return (*in)(x); }
  const std::vector<std::shared_ptr<nn::UnaryModule>>& blocks() const override { return stack; }
  Tensor head(const Tensor& h) override { return (*out)(h); }
  Tensor stage_loss(const Tensor& logits, const Tensor& y) override { return cross_entropy(logits, y); }
  Tensor example_input() const override { return empty({1, 12}, TensorOptions().with_device(kMeta)); }
};

// The staged model, built on Meta (parallelize initialises it from the
// seed), trained 10 steps of 4 micro-batches through forward_backward; its
// param_hash (every rank calls it: a collective) and what compile mode did.
struct StagedRun {
  std::string hash;
  CompileStats compile;
};
StagedRun train_staged(const MeshPtr& mesh, RunOptions o, bool compile_blocks_by_hand = false) {
  std::shared_ptr<StagedClassifier> model;
  {
    nn::ConstructionScope meta(kMeta);
    model = nn::make_model<StagedClassifier>();
  }
  if (compile_blocks_by_hand)
    for (const auto& block : model->blocks()) block->set_compiled(true);
  o.micro_batches = 4;
  o.seed = 1;
  auto run = parallelize(model, mesh, parallel::builtin_plan("none"), adamw(), o);
  for (int64_t step = 0; step < 10; ++step) {
    Tensor x = randn({32, 12}, PhiloxKey{1, stream_for("x", {uint64_t(step)})});
    run.forward_backward(x, argmax(x.narrow(1, 0, 5), 1));
    run.step_optimizer();
  }
  return StagedRun{run.param_hash(), run.compile_stats()};
}

std::string train_pipelined(bool pipelined) {
  std::string result;
  launch(pipelined ? 4 : 1, [&](int rank) {
    RunOptions o;
    o.compile = pipelined;
    const StagedRun r = train_staged(pipelined ? Mesh::world({{"dp", 2}, {"pp", 2}}) : nullptr, o);
    if (rank == 0) result = pipelined && r.compile.replays != 7 ? "not replayed: " + r.compile.refused : r.hash;
  });
  return result;
}

// The staged model on one device again, its blocks compiled by hand (mixed
// mode, docs/compile.md): each block replayed from its fourth call, the
// rest of the step eager; the same bits as the eager run.
std::string train_blocks_compiled() {
  const StagedRun r = train_staged(nullptr, RunOptions{}, /*compile_blocks_by_hand=*/true);
  const nn::ModuleCompileStats& c = r.compile.modules;
  if (c.replayed != 4 * (4 * 10 - 3)) return "not replayed: " + c.refused;  // 4 blocks, 4 micro-batches per step
  return r.hash;
}

// The staged model on dp=2 with FSDP (RunOptions::zero = 3, its blocks the
// units) and its blocks compiled (RunOptions::compile_modules): FSDP's
// hooks gather each block's parameters around the replayed block, and the
// run keeps the one-device bits.
std::string train_fsdp_blocks_compiled() {
  std::string result;
  launch(2, [&](int rank) {
    RunOptions o;
    o.zero = 3;
    o.compile_modules = nn::CompileModules::Blocks;
    const StagedRun r = train_staged(Mesh::world({{"dp", 2}}), o);
    const nn::ModuleCompileStats& c = r.compile.modules;
    if (rank == 0) result = c.replayed != 4 * (4 * 10 - 3) ? "not replayed: " + c.refused : r.hash;
  });
  return result;
}

int main() {
  numerics::BitwiseGuard bitwise(true);
  const std::string one = train(1), dp = train(2);
  std::printf("one device %s, dp=2 %s: %s\n", one.c_str(), dp.c_str(), one == dp ? "same bits" : "DIFFERENT");
  const std::string eager = train_forward_backward(false), compiled = train_forward_backward(true);
  std::printf("forward_backward eager %s, compiled %s: %s\n", eager.c_str(), compiled.c_str(),
              eager == compiled ? "same bits" : "DIFFERENT");
  const std::string staged = train_pipelined(false), pipelined = train_pipelined(true);
  std::printf("staged model: one device %s, dp=2 x pp=2 compiled %s: %s\n", staged.c_str(), pipelined.c_str(),
              staged == pipelined ? "same bits" : "DIFFERENT");
  const std::string mixed = train_blocks_compiled();
  std::printf("staged model: one device %s, its blocks compiled %s: %s\n", staged.c_str(), mixed.c_str(),
              staged == mixed ? "same bits" : "DIFFERENT");
  const std::string fsdp = train_fsdp_blocks_compiled();
  std::printf("staged model: one device %s, FSDP on dp=2 with its blocks compiled %s: %s\n", staged.c_str(),
              fsdp.c_str(), staged == fsdp ? "same bits" : "DIFFERENT");
  return one == dp && eager == compiled && staged == pipelined && staged == mixed && staged == fsdp ? 0 : 1;
}
