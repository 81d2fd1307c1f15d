// A transformer that is not one of tessel's models: GPT-J / PaLM-style
// *parallel* blocks (x + attn(ln(x)) + mlp(ln(x)), one norm, attention and
// MLP side by side), rotary positions, dropout, an untied LM head. Written as
// an nn::StagedModel, so the same model and loop run on dp=2 x tp=2 with
// sequence parallelism and on a pipeline of 2 stages (docs/your_model.md),
// on a plan derived from the model, and on the layout the planner picks for
// it. In bitwise mode every layout ends with the one-device run's bits.
#include <cstdio>

#include "planner/planner.h"
#include "tessel.h"
using namespace tessel;

constexpr int64_t kVocab = 64, kDim = 32, kHeads = 4, kLayers = 4, kSeq = 16;

struct ParallelBlock : nn::UnaryModule {
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Attention> attn;
  std::shared_ptr<nn::MLP> mlp;
  ParallelBlock() : nn::UnaryModule("ParallelBlock") {
    norm = child("norm", std::make_shared<nn::LayerNorm>(kDim));
    nn::AttentionConfig a;
    a.dim = kDim;
    a.n_head = kHeads;
    a.rope = true;
    a.max_seq_len = kSeq;
    a.attn_dropout = a.resid_dropout = 0.1;
    attn = child("attn", std::make_shared<nn::Attention>(a));
    mlp = child("mlp", std::make_shared<nn::MLP>(kDim, 4 * kDim, /*bias=*/true, /*dropout=*/0.1));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*norm)(x);
    return x + (*attn)(h) + (*mlp)(h);
  }
};

struct ParallelGPT : nn::StagedModel {
  std::shared_ptr<nn::Embedding> tokens;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> lm_head;
  std::vector<std::shared_ptr<nn::UnaryModule>> stack;
  explicit ParallelGPT(int64_t layers = kLayers) : nn::StagedModel("ParallelGPT") {
    tokens = child("tokens", std::make_shared<nn::Embedding>(kVocab, kDim));
    auto list = child("blocks", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < layers; ++i) list->push_back(stack.emplace_back(std::make_shared<ParallelBlock>()));
    norm = child("norm", std::make_shared<nn::LayerNorm>(kDim));
    lm_head = child("lm_head", std::make_shared<nn::Linear>(kDim, kVocab, /*bias=*/false));
  }
  Tensor embed(const Tensor& ids) override { return (*tokens)(ids); }
  const std::vector<std::shared_ptr<nn::UnaryModule>>& blocks() const override { return stack; }
  Tensor head(const Tensor& h) override { return (*lm_head)((*norm)(h)); }
  Tensor stage_loss(const Tensor& logits, const Tensor& y) override {
    return cross_entropy(logits.reshape({-1, kVocab}), y.reshape({-1}));
  }
  Tensor example_input() const override { return empty({1, 1}, TensorOptions(DType::Int64).with_device(kMeta)); }
};

// Megatron tensor + sequence parallelism over "tp"; dp and pp need no rules.
// (parallel::derive_plan finds the same from the model: see derived_plan.)
parallel::ParallelPlan plan() {
  parallel::ParallelPlan p;
  p.name = "parallel-gpt";
  p.vocabulary_parallel("tokens");
  p.column_parallel("blocks\\.\\d+\\.attn\\.w[qkv]", /*bias=*/false).row_parallel("blocks\\.\\d+\\.attn\\.wo");
  p.column_parallel("blocks\\.\\d+\\.mlp\\.fc").row_parallel("blocks\\.\\d+\\.mlp\\.proj");
  p.column_parallel("lm_head", /*bias=*/false);  // vocabulary-sharded logits
  p.sequence_parallel("blocks\\.\\d+\\.(attn|mlp)", "tokens", "norm");
  return p;
}

// A copy task: 9 random tokens, then the same 9 again; predict the next token.
std::pair<Tensor, Tensor> batch(int64_t step) {
  Tensor r = randint(0, kVocab, {8, 9}, PhiloxKey{3, stream_for("tokens", {uint64_t(step)})});
  Tensor ids = cat({r, r}, 1);
  return {ids.narrow(1, 0, kSeq), ids.narrow(1, 1, kSeq)};
}

// The same plan, derived from one traced forward on Meta instead of written.
parallel::ParallelPlan derived_plan(nn::StagedModel& model, bool sequence_parallel = true) {
  parallel::DeriveOptions options;
  options.sequence_parallel = sequence_parallel;
  return parallel::derive_plan(model, options);
}

// How a run is laid out: the mesh and what parallelize's options say about it.
struct Layout {
  std::vector<Mesh::DimSpec> mesh;  // empty: one device
  bool derive = false;              // the plan derived from the model instead of plan()
  bool sequence_parallel = true;    // (a derived plan)
  int zero = 0;
  nn::Recompute recompute = nn::Recompute::None;
  std::string schedule = "1f1b";
};

std::string train(const Layout& layout, int64_t steps) {
  int ranks = 1;
  for (const auto& d : layout.mesh) ranks *= int(d.size);
  std::string hash;
  launch(ranks, [&](int rank) {
    std::shared_ptr<ParallelGPT> model;
    {
      nn::ConstructionScope meta(kMeta);  // each rank creates only what it holds
      model = nn::make_model<ParallelGPT>();
    }
    RunOptions options;
    options.seed = 3;
    options.micro_batches = 2;
    options.clip = 1.0;
    options.zero = layout.zero;
    options.recompute = layout.recompute;
    options.pipeline_schedule = layout.schedule;
    const MeshPtr mesh = layout.mesh.empty() ? nullptr : Mesh::world(layout.mesh);
    auto run = parallelize(model, mesh, layout.derive ? derived_plan(*model, layout.sequence_parallel) : plan(),
                           adamw({1e-2}), options);
    for (int64_t step = run.step(); step < steps; ++step) {
      auto [x, y] = batch(step);
      const double loss = run.forward_backward(x, y).loss;
      run.step_optimizer();
      if (rank == 0 && step % 10 == 0) std::printf("  step %2lld  loss %.4f\n", (long long)step, loss);
    }
    const std::string h = run.param_hash();
    if (rank == 0) hash = h;
  });
  return hash;
}

// The planner's pick for this model on 4 H100s (planner/planner.h): every
// layout is simulated on the Meta device with the derived plan.
planner::Candidate planned_layout() {
  planner::PlanRequest request;
  request.model = planner::PlanModel::custom("ParallelGPT", kLayers,
                                             [](int64_t layers) { return nn::make_model<ParallelGPT>(layers); });
  request.cluster = planner::cluster_preset("h100");
  request.cluster.devices_per_node = 4;
  request.global_batch = 8;
  request.seq_len = kSeq;
  request.bitwise = true;
  request.fixed = {{"micro_batches", 2}};  // as train() runs
  const planner::PlanResult result = planner::plan(request);
  std::printf("%s", planner::format_plan(request, result).c_str());
  return result.best;
}

int main() {
  numerics::BitwiseGuard bitwise(true);
  int failures = 0;
  auto check = [&](const char* what, const std::string& hash, const std::string& expected) {
    std::printf("%-36s param_hash %s %s\n", what, hash.c_str(), hash == expected ? "(same bits)" : "DIFFERS");
    failures += hash != expected;
  };
  const std::string one = train({}, 40);
  check("one device", one, one);
  check("dp=2 x tp=2, sequence parallel", train({{{"dp", 2}, {"tp", 2}}}, 40), one);
  check("pipeline of 2 stages (1F1B)", train({{{"pp", 2}}}, 40), one);
  check("dp=2 x pp=2", train({{{"dp", 2}, {"pp", 2}}}, 40), one);
  check("dp=2 x tp=2, derived plan", train({{{"dp", 2}, {"tp", 2}}, /*derive=*/true}, 40), one);
  const planner::Candidate best = planned_layout();
  check(("planned: " + best.str()).c_str(),
        train({best.mesh_dims(), /*derive=*/true, best.sp, best.zero, best.recompute, best.schedule}, 40), one);
  // The derived plan lays the model out exactly as the hand-written one.
  std::shared_ptr<ParallelGPT> model;
  {
    nn::ConstructionScope meta(kMeta);
    model = nn::make_model<ParallelGPT>();
  }
  const bool same = parallel::plan_layout(derived_plan(*model), *model) == parallel::plan_layout(plan(), *model);
  std::printf("derived plan %s the hand-written one\n", same ? "lays the model out as" : "DIFFERS from");
  failures += !same;
  return failures == 0 ? 0 : 1;
}
