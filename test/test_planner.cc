// The planner's measurements (planner/simulate.h) against real runs: a step
// on the Meta device counts the FLOPs and redistribution bytes a real step
// of the same layout runs, exactly, on every rank; its memory peak is the
// real step's allocator peak; per-block costs scale to any depth; and the
// search (planner/planner.h) picks fitting layouts and explains the others.
#include <catch2/catch.hpp>

#include <mutex>

#include "autograd/api.h"
#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "dtensor/mesh.h"
#include "models/language_model.h"
#include "nn/nn.h"
#include "nn/parallel/parallelize.h"
#include "nn/parallel/plan.h"
#include "planner/planner.h"
#include "planner/simulate.h"
#include "runtime/allocator.h"
#include "runtime/comm/comm.h"
#include "runtime/cost.h"
#include "runtime/numerics.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::planner;

namespace {

// A model of one's own (no plan written): GPT-J-style parallel blocks.
constexpr int64_t kVocab = 64, kDim = 32;

// An op of one's own that has no sharding rule (an identity, in the block's
// residual stream): on a mesh it runs on replicated inputs.
struct OwnOpWithoutRule {
  static constexpr const char* kName = "own_op_without_rule";
  Tensor forward(const Tensor& x) { return detail::contiguous_raw(x); }
  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& g) { return {g[0]}; }
};

struct ParallelBlock : nn::UnaryModule {
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Attention> attn;
  std::shared_ptr<nn::MLP> mlp;
  bool own_op = false;
  explicit ParallelBlock(bool own_op_without_rule = false)
      : nn::UnaryModule("ParallelBlock"), own_op(own_op_without_rule) {
    norm = child("norm", std::make_shared<nn::LayerNorm>(kDim));
    nn::AttentionConfig a;
    a.dim = kDim;
    a.n_head = 4;
    a.rope = true;
    a.max_seq_len = 64;
    attn = child("attn", std::make_shared<nn::Attention>(a));
    mlp = child("mlp", std::make_shared<nn::MLP>(kDim, 4 * kDim, /*bias=*/true, /*dropout=*/0.0));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*norm)(x);
    if (own_op) h = call(OwnOpWithoutRule{}, h);
    return x + (*attn)(h) + (*mlp)(h);
  }
};

struct ParallelGPT : nn::StagedModel {
  std::shared_ptr<nn::Embedding> tokens;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> lm_head;
  std::vector<std::shared_ptr<nn::UnaryModule>> stack;
  explicit ParallelGPT(int64_t layers, bool own_op_without_rule = false) : nn::StagedModel("ParallelGPT") {
    tokens = child("tokens", std::make_shared<nn::Embedding>(kVocab, kDim));
    auto list = child("blocks", std::make_shared<nn::ModuleList>());
    for (int64_t i = 0; i < layers; ++i)
      list->push_back(stack.emplace_back(std::make_shared<ParallelBlock>(own_op_without_rule)));
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

PlanModel parallel_gpt(int64_t layers) {
  return PlanModel::custom("ParallelGPT", layers, [](int64_t n) { return nn::make_model<ParallelGPT>(n); });
}

// The same micro-batch for real (values, kernels, collectives) on every rank of l.
std::vector<RankCost> real_step(const PlanModel& pm, int64_t vocab, const ShardLayout& l) {
  const std::vector<Mesh::DimSpec> dims = mesh_dims(l);
  const int n = int(l.tp * l.cp * l.ep);
  numerics::BitwiseGuard bitwise(l.bitwise);
  std::vector<RankCost> out(static_cast<size_t>(n));
  auto rank_fn = [&](int rank) {
    MeshPtr mesh = dims.empty() ? nullptr : Mesh::world(dims);
    Allocator* a = cpu_allocator();
    const int64_t before = a->stats().current_bytes;
    if (n == 1) a->reset_peak();
    auto model = pm.build(pm.n_layer);
    model->reset_parameters(1);
    const auto plan = pm.plan_for(*model, l.sequence_parallel);
    if (mesh) parallel::parallelize(*model, mesh, plan);
    if (l.recompute != nn::Recompute::None) nn::apply_recompute(*model, l.recompute);
    model->train();
    Tensor ids = testing::randint({l.batch, l.seq_len}, 7, 0, vocab);
    Tensor targets = testing::randint({l.batch, l.seq_len}, 8, 0, vocab);
    cost::CountScope counting;  // the step (the Meta run counts from its forward on too)
    if (mesh) {
      ids = parallel::distribute_batch(ids, mesh, plan);
      targets = parallel::distribute_batch(targets, mesh, plan);
    }
    model->loss(model->forward(ids), targets).backward();
    RankCost& r = out[size_t(rank)];
    r.flops = counting.counts().flops();
    r.gemm_flops = counting.counts().gemm_flops;
    r.attention_flops = counting.counts().attention_flops;
    r.ops = counting.counts().ops;
    r.op_bytes = counting.counts().op_bytes;
    r.comm_bytes = counting.counts().comm_bytes;
    r.comm_calls = counting.counts().comm_calls;
    r.peak_bytes = n == 1 ? a->stats().peak_bytes - before : 0;
  };
  if (n == 1) {
    rank_fn(0);
  } else {
    comm::run_local(n, [&](int rank) { rank_fn(rank); });  // rank_fn reports, never asserts
  }
  return out;
}

}  // namespace

TEST_CASE("planner: a step on Meta counts a real step's FLOPs and redistribution bytes on every rank",
          "[planner]") {
  struct Case {
    std::string arch;
    ShardLayout l;
  };
  auto layout = [](int64_t tp, int64_t cp, bool sp, nn::Recompute r, bool bitwise = false) {
    ShardLayout l;
    l.tp = tp, l.cp = cp, l.sequence_parallel = sp, l.recompute = r, l.bitwise = bitwise;
    l.batch = cp > 1 ? 1 : 2;
    l.seq_len = 32;
    return l;
  };
  const std::vector<Case> cases = {
      {"llama", layout(1, 1, false, nn::Recompute::None)},
      {"nanogpt", layout(1, 1, false, nn::Recompute::Full)},
      {"llama", layout(2, 1, false, nn::Recompute::None)},
      {"nanogpt", layout(2, 1, true, nn::Recompute::None)},
      {"llama", layout(2, 1, true, nn::Recompute::Full)},
      {"llama", layout(1, 2, false, nn::Recompute::None, true)},
      {"llama", layout(2, 2, true, nn::Recompute::None)},
      {"custom", layout(1, 1, false, nn::Recompute::None)},
      {"custom", layout(2, 1, true, nn::Recompute::None)},
      {"custom", layout(2, 2, false, nn::Recompute::Full)},
  };
  for (const Case& k : cases) {
    INFO(k.arch << " " << k.l.str() << (k.l.bitwise ? " bitwise" : ""));
    // A shipped model (its built-in plan) or one of one's own (a derived plan).
    const models::ModelConfig config = models::model_config(k.arch == "custom" ? "llama" : k.arch, "tiny");
    const PlanModel c = k.arch == "custom" ? parallel_gpt(2) : PlanModel(config);
    const int64_t vocab = k.arch == "custom" ? kVocab : config.vocab_size;
    const auto meta = simulate(c, k.l), real = real_step(c, vocab, k.l);
    REQUIRE(meta.size() == real.size());
    for (size_t r = 0; r < meta.size(); ++r) {
      INFO("rank " << r);
      CHECK(meta[r].flops > 0);
      CHECK(meta[r].gemm_flops == real[r].gemm_flops);
      CHECK(meta[r].attention_flops == real[r].attention_flops);
      CHECK(meta[r].ops == real[r].ops);
      CHECK(meta[r].op_bytes == real[r].op_bytes);
      CHECK(meta[r].comm_bytes == real[r].comm_bytes);
      CHECK(meta[r].comm_calls == real[r].comm_calls);
    }
    if (real.size() == 1) {
      // The Meta peak is the allocator's (size classes included), but for
      // the workspace kernels allocate inside themselves (64 KiB here).
      CHECK(std::abs(meta[0].peak_bytes - real[0].peak_bytes) <= 65536);
    }
  }
}

TEST_CASE("planner: per-block costs from 2- and 3-block runs give any depth's costs", "[planner]") {
  models::ModelConfig c = models::model_config("llama", "tiny");
  c.n_layer = 5;
  ShardLayout l;
  l.tp = 2;
  l.batch = 2;
  l.seq_len = 32;
  const ModelCost per_block = simulate_per_block(c, l);
  const auto whole = simulate(c, l);
  const RankCost scaled = per_block.at(5);
  CHECK(scaled.flops == whole[0].flops);
  CHECK(scaled.ops == whole[0].ops);
  CHECK(scaled.op_bytes == whole[0].op_bytes);
  CHECK(scaled.param_bytes == whole[0].param_bytes);
  CHECK(scaled.comm_bytes == whole[0].comm_bytes);
  // The peak grows by one block's parameters, gradients and saved activations per block.
  CHECK(std::abs(double(scaled.peak_bytes) / double(whole[0].peak_bytes) - 1.0) < 0.05);
}

TEST_CASE("planner: the memory peak at depth, where it moves between phases of the step", "[planner]") {
  // LLaMA-3 8B's shapes (vocabulary 128256), 1 x 1024 tokens, bf16: the peak
  // is at the end of the backward with full recomputation (the gradients
  // pile up) and at its start without (every block's saved activations).
  for (const nn::Recompute policy : {nn::Recompute::None, nn::Recompute::Full}) {
    CAPTURE(nn::recompute_name(policy));
    models::ModelConfig c = models::model_config("llama", "llama3-8b");
    c.n_layer = 6;
    ShardLayout l;
    l.batch = 1;
    l.seq_len = 1024;
    l.compute = DType::BFloat16;
    l.recompute = policy;
    const RankCost scaled = simulate_per_block(c, l).at(6);
    const RankCost whole = simulate(c, l)[0];
    CHECK(scaled.step_peak() == whole.peak_bytes);
    CHECK(scaled.live_after_forward == whole.live_after_forward);
  }
}

TEST_CASE("planner: a micro-batch's costs are exact at every size, context parallel included", "[planner]") {
  // cp cuts [1, T, C] into tokens without a gather and [b, T, C] with one (the
  // LM head's flatten): costs are linear in b only from b = 2 on, so the
  // search measures b = 1 on its own and extends b = 2 and 3.
  Cluster cl = cluster_preset("h100");
  cl.devices_per_node = 2;
  cl.intra_latency_s = cl.inter_latency_s = 0;
  for (int64_t b : {1, 2, 3, 4, 6}) {
    CAPTURE(b);
    PlanRequest r;
    r.model = models::model_config("llama", "tiny");
    r.cluster = cl;
    r.global_batch = b;
    r.seq_len = 64;
    r.fixed = {{"cp", 2}, {"micro_batches", 1}, {"sp", 0}};
    r.recompute = nn::Recompute::None;
    const Candidate best = plan(r).best;
    REQUIRE(best.cp == 2);
    ShardLayout l;
    l.cp = 2;
    l.batch = b;
    l.seq_len = 64;
    const int64_t bytes = simulate(r.model, l)[0].total_comm_bytes();
    CHECK(best.model_comm_s * cl.intra_bw == Approx(double(bytes)).epsilon(1e-9));
  }
}

TEST_CASE("planner: the predicted per-rank memory is the allocator's peak of a real run", "[planner]") {
  // One device: the simulated micro-batch plus AdamW's state; the trainer's
  // own step (tessel train, allocator peak over the steps) within 2%.
  PlanRequest r;
  r.model = models::model_config("llama", "tiny");
  r.cluster = cluster_preset("h100", 1);  // speeds do not matter here
  r.cluster.devices_per_node = 1;
  r.global_batch = 8;
  r.seq_len = 64;
  r.fixed = {{"micro_batches", 1}};
  for (auto policy : {nn::Recompute::None, nn::Recompute::Full}) {
    r.recompute = policy;
    const PlanResult p = plan(r);
    train::TrainConfig c;
    c.model = "llama";
    c.model_config = "tiny";
    c.steps = 2;
    c.batch_size = 8;
    c.seq_len = 64;
    c.eval_every = 0;
    c.sample_length = 0;
    c.recompute = nn::recompute_name(policy);
    c.out_dir = testing::scratch_dir(std::string("planner_mem_") + nn::recompute_name(policy));
    const train::TrainResult t = train::run_training(c, {nullptr, /*quiet=*/true});
    INFO(nn::recompute_name(policy) << ": predicted " << p.best.total << ", measured " << t.allocator_peak_bytes);
    CHECK(std::abs(double(p.best.total) / double(t.allocator_peak_bytes) - 1.0) < 0.02);
  }
}

TEST_CASE("planner: the search fits memory, keeps constraints, explains the runners-up and refuses bad requests",
          "[planner]") {
  PlanRequest r;
  r.model = models::model_config("llama", "small");
  r.cluster = cluster_preset("h100", 1);
  r.global_batch = 16;
  r.seq_len = 256;
  const PlanResult p = plan(r);
  CHECK(p.best.fits);
  CHECK(p.best.dp * p.best.tp * p.best.pp * p.best.cp * p.best.ep == 8);
  CHECK(p.candidates > 20);
  REQUIRE(p.runners_up.size() == 5);
  for (const Candidate& c : p.runners_up) {
    CHECK(!c.why_not.empty());
    CHECK((!c.fits || c.step_s >= p.best.step_s));
  }
  const nlohmann::json j = plan_json(r, p);
  CHECK(j["best"]["memory_bytes"]["total"].get<int64_t>() == p.best.total);
  for (const Candidate& c : p.runners_up)  // the parts of the memory add up to its total
    CHECK(c.params + c.grads + c.optimizer + c.activations + c.comm_buffers == c.total);
  CHECK(j["runners_up"].size() == 5);
  CHECK(format_plan(r, p).find("run it: tessel train --model llama --config small") != std::string::npos);
  // Constraints hold.
  PlanRequest fixed = r;
  fixed.fixed = {{"tp", 2}, {"pp", 2}};
  const PlanResult f = plan(fixed);
  CHECK(f.best.tp == 2);
  CHECK(f.best.pp == 2);
  // Nothing fits: the error names the memory that would.
  PlanRequest tiny_memory = r;
  tiny_memory.cluster.memory_bytes = 1 << 20;
  CHECK_THROWS_WITH(plan(tiny_memory), Catch::Contains("nothing fits in 1.0 MiB per device") &&
                                           Catch::Contains("would fit it"));
  // Bad requests.
  PlanRequest bad = r;
  bad.fixed = {{"tensor", 2}};
  CHECK_THROWS_WITH(plan(bad), Catch::Contains("unknown constraint 'tensor'"));
  bad.fixed = {{"tp", 3}};
  CHECK_THROWS_WITH(plan(bad), Catch::Contains("do not divide the cluster's 8 devices"));
  bad.fixed = {{"ep", 2}};
  CHECK_THROWS_WITH(plan(bad), Catch::Contains("has no experts"));
  // Whole heads per rank, as tessel train requires (6 heads, 2 key/value heads).
  bad.fixed = {{"tp", 4}};
  CHECK_THROWS_WITH(plan(bad), Catch::Contains("tp=4 does not divide n_head=6 and n_kv_head=2"));
  bad.fixed = {{"pp", 1}, {"virtual_stages", 2}};
  CHECK_THROWS_WITH(plan(bad), Catch::Contains("matches the constraints (pp=1,virtual_stages=2)") &&
                                   Catch::Contains("interleaved stages (virtual_stages > 1) need pp > 1"));
  CHECK_THROWS_WITH(cluster_preset("a100"), Catch::Contains("unknown cluster preset 'a100' (cpu, h100, h200)"));
  bad = r;
  bad.seq_len = 100000;
  CHECK_THROWS_WITH(plan(bad), Catch::Contains("exceeds the context"));
}

TEST_CASE("planner: with_devices cuts a cluster to whole nodes, or shares this machine's cores", "[planner]") {
  const Cluster h100 = cluster_preset("h100");
  Cluster c = with_devices(h100, 4);
  CHECK((c.nodes == 1 && c.devices_per_node == 4 && c.flops_16 == h100.flops_16));
  c = with_devices(h100, 16);
  CHECK((c.nodes == 2 && c.devices_per_node == 8));
  CHECK_THROWS_WITH(with_devices(h100, 12), Catch::Contains("12 devices on h100 with 8 devices per node"));
  CHECK_THROWS_WITH(with_devices(h100, 0), Catch::Contains("devices must be >= 1"));
  // The cpu preset: up to its cores, each device is a core; beyond, the
  // devices share them (MPI oversubscribed): each keeps a core's speeds when
  // it runs alone, has its share of the memory, and the planner bounds a
  // step by the total work over the cores.
  Cluster cpu = cluster_preset("cpu");
  cpu.devices_per_node = 2;  // a machine of 2 cores, whatever this one has
  cpu.memory_bytes = int64_t(8) << 30;
  c = with_devices(cpu, 2);
  CHECK((c.devices() == 2 && c.core_share == 1.0 && c.memory_bytes == cpu.memory_bytes));
  c = with_devices(cpu, 4);
  CHECK((c.nodes == 1 && c.devices_per_node == 4 && c.flops_f32 == cpu.flops_f32));
  CHECK(c.core_share == 0.5);
  CHECK(c.memory_bytes == int64_t(4) << 30);
  // Planned on it: a layout without a pipeline takes twice a core's time for
  // its work; a pipeline's bubble is not idle cores (its ranks' work over the
  // cores bounds the step, and here sets it).
  PlanRequest r;
  r.model = models::model_config("llama", "tiny");
  r.global_batch = 4;
  r.seq_len = 64;
  r.fixed = {{"dp", 4}, {"zero", 0}, {"micro_batches", 1}};
  r.cluster = c;
  const Candidate shared = plan(r).best;
  r.cluster = cpu;
  r.cluster.devices_per_node = 4;  // 4 whole cores
  const Candidate alone = plan(r).best;
  CHECK(shared.compute_s == Approx(2 * alone.compute_s));
  r.fixed = {{"pp", 2}, {"dp", 2}, {"micro_batches", 2}, {"virtual_stages", 1}};
  const Candidate pipe_alone = plan(r).best;
  r.cluster = c;
  const Candidate pipe_shared = plan(r).best;
  CHECK(pipe_alone.bubble > 0.3);
  CHECK(pipe_shared.compute_s + pipe_shared.model_comm_s + pipe_shared.pipeline_s <
        2 * (pipe_alone.compute_s + pipe_alone.model_comm_s + pipe_alone.pipeline_s));
}

TEST_CASE("planner: a model of one's own is planned on its derived plan", "[planner]") {
  PlanRequest r;
  r.model = parallel_gpt(4);
  CHECK(r.model.dim == kDim);
  CHECK(r.model.num_experts == 0);
  r.cluster = cluster_preset("h100");
  r.cluster.devices_per_node = 4;
  r.global_batch = 8;
  r.seq_len = 32;
  r.fixed = {{"tp", 2}, {"sp", 1}};
  const PlanResult p = plan(r);
  CHECK(p.best.tp == 2);
  CHECK(p.best.sp);
  const std::string report = format_plan(r, p);
  INFO(report);
  CHECK_THAT(report, Catch::Contains("blocks\\.\\d+\\.attn\\.(wq|wk|wv)\\.weight"));
  CHECK_THAT(report, Catch::Contains("blocks\\.\\d+\\.(attn|mlp)") || Catch::Contains("blocks\\.\\d+\\.(mlp|attn)"));
  CHECK_THAT(report, Catch::Contains("run it: Mesh::world({"));
  const nlohmann::json j = plan_json(r, p);
  CHECK(j["parallel_plan"]["params"].size() >= 4);
  // A model that is not a token model, or a build that ignores the depth, is refused.
  CHECK_THROWS_WITH(PlanModel::custom("x", 4, [](int64_t) { return nn::make_model<ParallelGPT>(2); }),
                    Catch::Contains("build(1) must give a model of 1 block, got 2"));
}

TEST_CASE("planner: under ep each rank simulates its own sequences (the ep group holds ep times them)",
          "[planner]") {
  // With Meta's balanced routing an ep=2 rank with b sequences runs their
  // attention and half the experts on the group's 2b sequences' tokens: the
  // FLOPs of one device with b sequences. (The first version cut the
  // group's batch over ep twice and counted half.)
  const PlanModel m = models::model_config("mixtral", "tiny");
  ShardLayout one;
  one.batch = 2;
  one.seq_len = 32;
  ShardLayout ep = one;
  ep.ep = 2;
  const RankCost a = simulate(m, one)[0];
  const std::vector<RankCost> b = simulate(m, ep);
  REQUIRE(b.size() == 2);
  for (const RankCost& r : b) CHECK(r.flops == a.flops);
}

TEST_CASE("planner: a known blind spot is a warning in the report: bitwise MoE tokens gathered over dp", "[planner]") {
  PlanRequest r;
  r.model = models::model_config("mixtral", "tiny");
  r.cluster = cluster_preset("h100");
  r.cluster.devices_per_node = 2;
  r.global_batch = 4;
  r.seq_len = 32;
  r.fixed = {{"dp", 2}};
  PlanResult p = plan(r);
  CHECK(p.warnings.empty());  // fast mode: each dp rank routes its own tokens
  r.bitwise = true;
  p = plan(r);
  CHECK_THAT(format_plan(r, p), Catch::Contains("warning: bitwise mode: the MoE layers gather their tokens over dp"));
  CHECK(plan_json(r, p)["warnings"].size() == 1);
  r.fixed = {{"ep", 2}};
  p = plan(r);
  CHECK(p.warnings.empty());
}

TEST_CASE("planner: an op without a sharding rule is planned replicated and named in the report", "[planner]") {
  PlanRequest r;
  r.model = PlanModel::custom("ParallelGPT with an op of its own", 4,
                              [](int64_t n) { return nn::make_model<ParallelGPT>(n, /*own_op_without_rule=*/true); });
  r.cluster = cluster_preset("h100");
  r.cluster.devices_per_node = 4;
  r.global_batch = 8;
  r.seq_len = 32;
  r.fixed = {{"tp", 2}, {"dp", 2}};
  PlanResult p = plan(r);
  std::string report = format_plan(r, p);
  INFO(report);
  // One call per block's forward, in every layout; under tp the prediction
  // counts its calls (and the gathers before them), under dp the report warns.
  CHECK(p.ops_without_sharding_rule == std::map<std::string, int64_t>{{"own_op_without_rule", 4}});
  CHECK(p.best.replicated_fallbacks == std::map<std::string, int64_t>{{"own_op_without_rule", 4}});
  CHECK_THAT(report, Catch::Contains("ops without a sharding rule: own_op_without_rule (4 per sequence's step)"));
  CHECK_THAT(report, Catch::Contains("the prediction counts it over tp/cp/ep"));
  CHECK_THAT(report, Catch::Contains("over dp the batch is gathered too"));
  CHECK(plan_json(r, p)["ops_without_sharding_rule"]["own_op_without_rule"] == 4);
  CHECK(plan_json(r, p)["best"]["ops_without_sharding_rule"]["own_op_without_rule"] == 4);
  // Without it, nothing is listed.
  r.model = parallel_gpt(4);
  p = plan(r);
  CHECK(p.ops_without_sharding_rule.empty());
  CHECK_THAT(format_plan(r, p), !Catch::Contains("without a sharding rule"));
}

TEST_CASE("planner: tessel train --mesh auto runs the planner's layout; in bitwise mode the one-device bits",
          "[planner]") {
  auto config = [](const std::string& mesh, int64_t devices) {
    train::TrainConfig c;
    c.model = "llama";
    c.model_config = "tiny";
    c.steps = 3;
    c.batch_size = 8;
    c.seq_len = 32;
    c.eval_every = 0;
    c.sample_length = 0;
    c.bitwise = true;
    c.mesh = mesh;
    c.devices = devices;
    c.out_dir = testing::scratch_dir("planner_auto_" + std::to_string(devices));
    return c;
  };
  const train::TrainResult one = train::run_training(config("", 0), {nullptr, true});
  const train::TrainResult autoplanned = train::run_training(config("auto", 2), {nullptr, true});
  CHECK(autoplanned.param_hash == one.param_hash);
  CHECK(autoplanned.final_loss == one.final_loss);
  // --devices without --mesh auto is an error.
  CHECK_THROWS_WITH(train::run_training(config("dp=2", 2), {nullptr, true}),
                    Catch::Contains("devices = 2 applies to mesh = auto only"));
}
