// Your own model on every layout with the same loop (docs/your_model.md).
// A residual-MLP classifier trained 30 steps on one device, on dp=2 x tp=2
// with ZeRO-2, and with FSDP; checkpointed at step 15 and resumed on tp=2 and
// on one device. In bitwise mode every run ends with the one-device run's bits.
#include <cstdio>

#include "tessel.h"
using namespace tessel;

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

struct Classifier : nn::Module {
  std::shared_ptr<nn::Linear> embed, head;
  std::shared_ptr<nn::LayerNorm> norm;
  std::vector<std::shared_ptr<Block>> blocks;
  Classifier(int64_t in, int64_t d, int64_t classes) : nn::Module("Classifier") {
    embed = child("embed", std::make_shared<nn::Linear>(in, d));
    auto list = child("blocks", std::make_shared<nn::ModuleList>());
    for (int i = 0; i < 2; ++i) list->push_back(blocks.emplace_back(std::make_shared<Block>(d)));
    norm = child("norm", std::make_shared<nn::LayerNorm>(d));
    head = child("head", std::make_shared<nn::Linear>(d, classes));
  }
  Tensor loss(const Tensor& x, const Tensor& y) {
    Tensor h = (*embed)(x);
    for (auto& b : blocks) h = (*b)(h);
    return cross_entropy((*head)((*norm)(h)), y);
  }
};

// Step `step`'s batch, the same on every rank: x ~ N(0, 1), y = argmax(x W).
std::pair<Tensor, Tensor> batch(int64_t step) {
  Tensor x = randn({32, 12}, PhiloxKey{1, stream_for("x", {uint64_t(step)})});
  return {x, argmax(matmul(x, randn({12, 5}, PhiloxKey{1, stream_for("W")})), 1)};
}

// Megatron tensor parallelism for the blocks, written by hand.
parallel::ParallelPlan hand_plan() {
  parallel::ParallelPlan plan;
  plan.column_parallel("blocks\\.\\d+\\.fc1").row_parallel("blocks\\.\\d+\\.fc2");
  return plan;
}

// The same, derived from one traced forward on Meta (no plan written): fc1 ->
// fc2 in each block, and the head column parallel (class-sharded logits).
parallel::ParallelPlan derived_plan(Classifier& model) {
  const Tensor x = empty({32, 12}, TensorOptions().with_device(kMeta));
  const Tensor y = empty({32}, TensorOptions(DType::Int64).with_device(kMeta));
  return parallel::derive_plan(model, [&] { return model.loss(x, y); });
}

// 30 steps on `mesh` (empty: one device); saves at step 15 or starts from `resume`.
std::string train(std::vector<Mesh::DimSpec> mesh, int zero, const std::string& save_to, const std::string& resume,
                  bool derive = false) {
  int ranks = 1;
  for (const auto& d : mesh) ranks *= int(d.size);
  std::string hash;
  launch(ranks, [&](int rank) {
    auto model = nn::make_model<Classifier>(12, 32, 5);
    model->reset_parameters(/*seed=*/1);
    const parallel::ParallelPlan plan = derive ? derived_plan(*model) : hand_plan();
    RunOptions options{zero, /*clip=*/1.0};
    options.fsdp_units = "blocks\\.\\d+";
    auto run = parallelize(model, mesh.empty() ? nullptr : Mesh::world(mesh), plan, adamw({1e-2}), options);
    if (!resume.empty()) load(resume, run);
    for (int64_t step = run.step(); step < 30; ++step) {
      auto [x, y] = batch(step);
      Tensor loss = run.model().loss(run.input(x), run.input(y));
      loss.backward();
      run.step_optimizer();
      if (rank == 0 && step % 10 == 0) std::printf("  step %2lld  loss %.4f\n", (long long)step, loss.item<double>());
      if (run.step() == 15 && !save_to.empty()) save(save_to, run);
    }
    const std::string h = run.param_hash();  // collective: every rank
    if (rank == 0) hash = h;
  });
  return hash;
}

int main(int argc, char** argv) {
  const std::string ckpt = argc > 1 ? argv[1] : "mlp_classifier_step15";
  numerics::BitwiseGuard bitwise(true);  // reaches every rank that launch() starts
  int failures = 0;
  auto check = [&](const char* what, const std::string& hash, const std::string& expected) {
    std::printf("%-34s param_hash %s %s\n", what, hash.c_str(), hash == expected ? "(same bits)" : "DIFFERS");
    failures += hash != expected;
  };
  const std::string one = train({}, 0, ckpt, "");
  check("one device", one, one);
  check("dp=2 x tp=2, ZeRO-2", train({{"dp", 2}, {"tp", 2}}, 2, "", ""), one);
  check("dp=2 x tp=2, FSDP", train({{"dp", 2}, {"tp", 2}}, 3, "", ""), one);
  check("dp=2 x tp=2, derived plan", train({{"dp", 2}, {"tp", 2}}, 2, "", "", /*derive=*/true), one);
  check("resumed at step 15 on tp=2", train({{"tp", 2}}, 0, "", ckpt), one);
  check("resumed at step 15 on one device", train({}, 0, "", ckpt), one);
  return failures == 0 ? 0 : 1;
}
