// Pipeline parallelism: the schedule generators and their checker (plain
// data), the stage cut, and training equivalence: NanoGPT (dropout on), LLaMA
// and Mixtral, 20 steps on pp2 with GPipe, 1F1B and interleaved 1F1B, on
// tp2 + sequence parallel x pp2 and on dp2 x tp2 x pp2 (the local backend:
// ranks as threads) give the single-device losses, grad norms and final
// parameters within float tolerance (as test_parallel_train); on pp2 alone
// LLaMA and Mixtral give the same bits.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <set>
#include <tuple>

#include "autograd/api.h"
#include "nn/parallel/pipeline/partition.h"
#include "nn/parallel/pipeline/pipeline.h"
#include "nn/parallel/pipeline/schedule.h"
#include "runtime/comm/comm.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::parallel::pipeline;
using tessel::train::TrainConfig;

namespace {

// ---- schedules, checked independently of check_schedule ------------------------------

// Every (chunk, mb) forwarded once and backwarded once after it on its rank.
void check_forward_before_backward(const Schedule& s) {
  for (int r = 0; r < s.pp; ++r) {
    std::map<std::pair<int, int>, int> fwd, bwd;
    const auto& l = s.ranks[size_t(r)];
    for (int i = 0; i < int(l.size()); ++i) {
      if (l[size_t(i)].op == Op::Forward) fwd[{l[size_t(i)].chunk, l[size_t(i)].mb}] = i;
      if (l[size_t(i)].op == Op::Backward) bwd[{l[size_t(i)].chunk, l[size_t(i)].mb}] = i;
    }
    REQUIRE(int(fwd.size()) == s.virtual_stages * s.micro_batches);
    REQUIRE(bwd.size() == fwd.size());
    for (auto& [k, i] : fwd) CHECK(i < bwd[k]);
  }
}

// Every send has exactly one matching receive: (kind, stage it goes to, mb).
void check_sends_matched(const Schedule& s) {
  std::multiset<std::tuple<int, int, int>> sent, received;
  for (int r = 0; r < s.pp; ++r) {
    for (const Instr& in : s.ranks[size_t(r)]) {
      const int vs = s.stage_of(r, in.chunk);
      if (in.op == Op::SendAct) sent.insert({0, vs + 1, in.mb});
      if (in.op == Op::SendGrad) sent.insert({1, vs - 1, in.mb});
      if (in.op == Op::RecvAct) received.insert({0, vs, in.mb});
      if (in.op == Op::RecvGrad) received.insert({1, vs, in.mb});
    }
  }
  CHECK(sent == received);
}

// Most (chunk, mb) forwarded and not yet backwarded, per rank.
std::vector<int> in_flight(const Schedule& s) {
  std::vector<int> peak;
  for (const auto& l : s.ranks) {
    int f = 0, p = 0;
    for (const Instr& in : l) {
      if (in.op == Op::Forward) p = std::max(p, ++f);
      if (in.op == Op::Backward) --f;
    }
    peak.push_back(p);
  }
  return peak;
}

std::vector<std::pair<int, int>> forwards(const Schedule& s, int r) {
  std::vector<std::pair<int, int>> v;
  for (const Instr& in : s.ranks[size_t(r)])
    if (in.op == Op::Forward) v.push_back({in.chunk, in.mb});
  return v;
}

}  // namespace

TEST_CASE("GPipe and 1F1B schedules: order, matching, in-flight bound, bubble", "[pipeline][schedule]") {
  for (int pp = 1; pp <= 4; ++pp) {
    for (int m = 1; m <= 8; ++m) {
      INFO("pp " << pp << " M " << m);
      const Schedule g = gpipe(pp, m);
      check_forward_before_backward(g);
      check_sends_matched(g);
      const ScheduleStats gs = check_schedule(g);
      for (int r = 0; r < pp; ++r) CHECK(in_flight(g)[size_t(r)] == m);
      CHECK(gs.peak_in_flight == in_flight(g));
      // Forward 1, backward 2, free communication: 3 (M + pp - 1) per step.
      CHECK(gs.makespan == Approx(3.0 * (m + pp - 1)));
      CHECK(gs.bubble == Approx(double(pp - 1) / double(m + pp - 1)));
      if (m < pp) {
        CHECK_THROWS_WITH(one_f_one_b(pp, m), Catch::Contains("1f1b needs micro_batches >= pp"));
        continue;
      }
      const Schedule f = one_f_one_b(pp, m);
      check_forward_before_backward(f);
      check_sends_matched(f);
      const ScheduleStats fs = check_schedule(f);
      for (int r = 0; r < pp; ++r) CHECK(in_flight(f)[size_t(r)] == std::min(pp - r, m));  // the 1F1B bound
      CHECK(fs.makespan == Approx(gs.makespan));  // same bubble as GPipe, less memory
    }
  }
}

TEST_CASE("interleaved 1F1B: Megatron's order, matching, smaller bubble", "[pipeline][schedule]") {
  for (int pp : {2, 3, 4}) {
    for (int v : {2, 3}) {
      for (int m : {pp, 2 * pp, 3 * pp}) {
        INFO("pp " << pp << " V " << v << " M " << m);
        const Schedule s = interleaved_1f1b(pp, m, v);
        check_forward_before_backward(s);
        check_sends_matched(s);
        const ScheduleStats st = check_schedule(s);
        for (int r = 0; r < pp; ++r) {
          // Forwards go in groups of pp micro-batches through chunk 0, 1, ...
          const auto fw = forwards(s, r);
          for (int k = 0; k < int(fw.size()); ++k) {
            CHECK(fw[size_t(k)].first == (k / pp) % v);
            CHECK(fw[size_t(k)].second == (k / (pp * v)) * pp + k % pp);
          }
          // Warm-up bounds the activations in flight.
          const int warmup = m == pp ? m * v : std::min((pp - r - 1) * 2 + (v - 1) * pp, m * v);
          CHECK(st.peak_in_flight[size_t(r)] == std::min(warmup + 1, m * v));
        }
        if (m > pp) CHECK(st.bubble < check_schedule(one_f_one_b(pp, m)).bubble);
      }
    }
  }
  CHECK_THROWS_WITH(interleaved_1f1b(2, 3, 2), Catch::Contains("multiple of pp"));
  CHECK_THROWS_WITH(interleaved_1f1b(2, 4, 1), Catch::Contains("virtual_stages >= 2"));
  CHECK_THROWS_WITH(make_schedule("gpipe", 2, 4, 2), Catch::Contains("needs the interleaved schedule"));
  CHECK_THROWS_WITH(make_schedule("zigzag", 2, 4, 1), Catch::Contains("unknown pipeline schedule 'zigzag'"));
}

TEST_CASE("check_schedule names what is wrong", "[pipeline][schedule]") {
  // Rank 1 runs its micro-batches in another order than rank 0 sends them.
  Schedule s = one_f_one_b(2, 2);
  auto& l1 = s.ranks[1];
  for (Instr& in : l1) in.mb = 1 - in.mb;
  CHECK_THROWS_WITH(check_schedule(s), Catch::Contains("disagree on the order"));
  // Backwards in another order than the forwards.
  s = gpipe(2, 2);
  for (Instr& in : s.ranks[0])
    if (in.op == Op::Backward || in.op == Op::RecvGrad) in.mb = 1 - in.mb;
  CHECK_THROWS_WITH(check_schedule(s), Catch::Contains("backwards run the micro-batches in the order [1, 0]"));
  // A missing backward.
  s = gpipe(2, 2);
  s.ranks[0].pop_back();
  CHECK_THROWS_WITH(check_schedule(s), Catch::Contains("rank 0") && Catch::Contains("is missing"));
  // Rank 0 waits for mb 0's gradient before sending mb 0's activation.
  s = gpipe(2, 1);  // rank 0: F0.0 sa0.0 rg0.0 B0.0
  std::swap(s.ranks[0][1], s.ranks[0][2]);
  CHECK_THROWS_WITH(check_schedule(s), Catch::Contains("deadlocks") && Catch::Contains("rank 0 at instruction 1"));
  // Receive before the compute that needs it.
  s = gpipe(2, 1);  // rank 1: ra0.0 F0.0 B0.0 sg0.0
  std::swap(s.ranks[1][0], s.ranks[1][1]);
  CHECK_THROWS_WITH(check_schedule(s), Catch::Contains("RecvAct") && Catch::Contains("must come before Forward"));
}

TEST_CASE("forward-only schedule runs every chunk once per micro-batch", "[pipeline][schedule]") {
  const Schedule s = forward_only(3, 2, 2);
  const ScheduleStats st = check_schedule(s);
  for (int r = 0; r < 3; ++r) CHECK(forwards(s, r).size() == 4);
  for (int p : st.peak_in_flight) CHECK(p == 0);
}

TEST_CASE("partitions by layer count and by parameter count", "[pipeline][partition]") {
  CHECK(partition_by_layers(5, 2).str() == "[0, 3) [3, 5)");
  CHECK(partition_by_layers(8, 4).str() == "[0, 2) [2, 4) [4, 6) [6, 8)");
  // The embedding weighs two blocks: stage 0 gets one block.
  CHECK(partition_by_params({1, 1, 1, 1}, 2, 0, 2).str() == "[0, 1) [1, 4)");
  CHECK(partition_by_params({1, 1, 1, 1}, 0, 2, 2).str() == "[0, 3) [3, 4)");
  CHECK(partition_by_params({5, 1, 1, 1, 1, 1}, 0, 0, 3).str() == "[0, 1) [1, 3) [3, 6)");
  CHECK_THROWS_WITH(partition_by_layers(3, 4), Catch::Contains("3 blocks cannot fill 4 pipeline stages"));
  CHECK_THROWS_WITH(make_partition("flops", {1, 1}, 0, 0, 2, "m"), Catch::Contains("unknown split 'flops'"));
  CHECK_THROWS_WITH(make_partition("params", {1, 1}, 0, 0, 3, "model m"),
                    Catch::Contains("model m: every stage needs at least one block"));
}

// ---- the stage cut ----------------------------------------------------------------------

TEST_CASE("each rank holds only its stage's parameters; tied wte on the first and last", "[pipeline][stage]") {
  models::ModelConfig mc = models::model_config("nanogpt", "tiny");
  mc.n_layer = 4;
  comm::run_local(2, [&](int rank) {
    MeshPtr mesh = Mesh::world({{"pp", 2}});
    std::shared_ptr<models::LanguageModel> model;
    {
      nn::ConstructionScope meta(kMeta);
      model = models::build_model(mc);
    }
    PipelineStage stage(model, mesh, parallel::builtin_plan("none"), 1, StageOptions{});
    std::set<std::string> held;
    for (const auto& p : stage.named_parameters()) {
      held.insert(p.name);
      CHECK(p.tensor.device() == kCPU);
    }
    CHECK(held.count("wte.weight") == 1);  // tied: embedding on rank 0, LM head on rank 1
    CHECK(held.count("wpe.weight") == size_t(rank == 0));
    CHECK(held.count("ln_f.weight") == size_t(rank == 1));
    CHECK(held.count("layers.1.attn.wq.weight") == size_t(rank == 0));
    CHECK(held.count("layers.2.attn.wq.weight") == size_t(rank == 1));
    for (const auto& p : stage.model().named_parameters())
      if (!held.count(p.name)) CHECK(p.tensor.device().is_meta());  // never allocated
    for (const ParamHome& h : stage.homes()) {
      if (h.name == "wte.weight") CHECK((h.tied && h.primary == 0));
      else CHECK_FALSE(h.tied);
    }
    // Values are the single-device ones: (seed, path) alone decide them.
    auto ref = models::make_language_model(mc, 1);
    for (const auto& p : stage.named_parameters())
      for (const auto& q : ref->named_parameters())
        if (p.name == q.name) CHECK(testing::bitwise_equal(p.tensor.detach(), q.tensor.detach()));
  });
}

// ---- training equivalence ----------------------------------------------------------------

namespace {

struct Run {
  std::vector<double> losses, grad_norms, comm_wait, comm_wait_mean;
  std::vector<std::pair<std::string, Tensor>> params;
  std::string param_hash;
  double heldout = 0;
};

TrainConfig base(const std::string& model, const std::string& out) {
  TrainConfig c;
  c.model = model;
  c.model_config = "tiny";
  c.n_layer = 4;  // pp 2 x V 2 needs four blocks
  c.steps = 20;
  c.batch_size = 8;
  c.seq_len = 16;
  c.micro_batches = 4;
  c.eval_every = 0;
  c.eval_batches = 2;
  c.sample_length = 0;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.warmup_steps = 5;
  c.dropout = model == "nanogpt" ? 0.1 : -1;
  c.out_dir = out;
  return c;
}

Run run(TrainConfig c) {
  Run r;
  train::TrainHooks h;
  h.quiet = true;
  h.keep_params = true;
  h.on_step = [&](const train::StepMetrics& m) {
    r.losses.push_back(*m.loss);
    r.grad_norms.push_back(*m.grad_norm);
    for (auto& [k, v] : m.extras) {
      if (k == "comm_wait_s") r.comm_wait.push_back(v);
      if (k == "comm_wait_mean_s") r.comm_wait_mean.push_back(v);
    }
  };
  train::TrainResult res = train::run_training(c, h);
  r.params = res.final_params;
  r.param_hash = res.param_hash;
  r.heldout = res.heldout_loss;
  return r;
}

std::string scratch(const std::string& name) {
  return (std::filesystem::path(tessel::testing::scratch_dir("pipeline")) / name).string();
}

void check_same(const Run& ref, const Run& got, const std::string& what) {
  INFO(what);
  REQUIRE(got.losses.size() == ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(got.losses[i] == Approx(ref.losses[i]).epsilon(2e-5));
    CHECK(got.grad_norms[i] == Approx(ref.grad_norms[i]).epsilon(1e-4));
  }
  CHECK(got.heldout == Approx(ref.heldout).epsilon(2e-5));  // the forward-only path
  REQUIRE(got.params.size() == ref.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i) {
    INFO("parameter " << ref.params[i].first);
    CHECK(got.params[i].first == ref.params[i].first);
    CHECK(testing::allclose(got.params[i].second, ref.params[i].second, 1e-4, 2e-5));
  }
  // The metrics' hash covers every stage's parameters.
  CHECK(got.param_hash == train::param_hash(got.params));
  CHECK(got.comm_wait.size() == got.losses.size());
  CHECK(got.comm_wait_mean.size() == got.losses.size());
}

}  // namespace

TEST_CASE("20 steps on pp2 (gpipe, 1f1b, interleaved), tp2+sp x pp2 and dp2 x tp2 x pp2 match one device",
          "[pipeline][train]") {
  for (std::string model : {"nanogpt", "llama", "mixtral"}) {
    const Run ref = run(base(model, scratch(model + "_ref")));
    REQUIRE(ref.losses.size() == 20);
    CHECK(ref.losses.back() < ref.losses.front());
    struct Layout {
      const char* mesh;
      const char* schedule;
      const char* split;
      bool sp;
    };
    for (Layout l : {Layout{"pp=2", "gpipe", "layers", false}, Layout{"pp=2", "1f1b", "params", false},
                     Layout{"pp=2", "interleaved", "layers", false}, Layout{"tp=2,pp=2", "gpipe", "layers", true},
                     Layout{"dp=2,tp=2,pp=2", "1f1b", "layers", false},
                     Layout{"dp=2,tp=2,pp=2", "interleaved", "layers", false}}) {
      TrainConfig c = base(model, scratch(model + "_pp"));
      c.mesh = l.mesh;
      c.pipeline_schedule = l.schedule;
      c.pipeline_split = l.split;
      c.sequence_parallel = l.sp;
      const Run got = run(c);
      check_same(ref, got,
                 model + " on " + l.mesh + (l.sp ? " + sp " : " ") + l.schedule + " split by " + l.split);
      if (model != "nanogpt" && std::string(l.mesh) == "pp=2") {
        // Pipeline stages alone change no arithmetic: each micro-batch's
        // gradients accumulate in the same order, and the norm is combined
        // in the single-device order. (NanoGPT's tied wte sums its embedding
        // and LM-head gradients in another order; dp/tp have their own.)
        INFO(model << " on pp=2 " << l.schedule << ": bitwise");
        for (size_t i = 0; i < ref.grad_norms.size(); ++i) CHECK(got.grad_norms[i] == ref.grad_norms[i]);
        for (size_t i = 0; i < ref.params.size(); ++i)
          CHECK(testing::bitwise_equal(got.params[i].second, ref.params[i].second));
      }
    }
  }
}

TEST_CASE("bad pipeline settings fail before anything is written", "[pipeline][train]") {
  auto expect = [](TrainConfig c, const std::string& needle) {
    std::string out = scratch("bad");
    c.out_dir = out;
    CHECK_THROWS_WITH(train::run_training(c, {nullptr, true}), Catch::Contains(needle));
    CHECK_FALSE(std::filesystem::exists(out));
  };
  TrainConfig c = base("nanogpt", "");
  c.steps = 1;
  TrainConfig bad = c;
  bad.mesh = "pp=2";
  bad.micro_batches = 1;
  expect(bad, "1f1b needs micro_batches >= pp");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_schedule = "interleaved";
  bad.micro_batches = 2;
  bad.n_layer = 2;
  expect(bad, "has 2 blocks, fewer than the pp x V = 2 x 2 = 4 stages of mesh (pp=2)");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_schedule = "interleaved";
  bad.micro_batches = 8;
  bad.batch_size = 8;
  bad.virtual_stages = 3;
  expect(bad, "has 4 blocks, fewer than the pp x V = 2 x 3 = 6 stages");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_schedule = "interleaved";
  bad.batch_size = 6;
  bad.micro_batches = 3;
  expect(bad, "multiple of pp");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_schedule = "gpipe";
  bad.virtual_stages = 2;
  expect(bad, "needs the interleaved schedule");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_schedule = "zigzag";
  expect(bad, "pipeline_schedule must be one of gpipe | 1f1b | interleaved");
  bad = c;
  bad.mesh = "pp=2";
  bad.pipeline_split = "flops";
  expect(bad, "pipeline_split must be one of layers | params");
}


// Not run by default: prints the schedules and the simulated bubbles quoted
// in docs/parallel.md (test_pipeline "[.print]").
TEST_CASE("print schedules and bubbles", "[.print]") {
  std::printf("%s\n%s\n%s\n", gpipe(2, 4).str().c_str(), one_f_one_b(2, 4).str().c_str(),
              interleaved_1f1b(2, 4, 2).str().c_str());
  std::printf("pp  M  gpipe  1f1b  interleaved V=2  V=4   | peak in flight on rank 0: gpipe 1f1b V=2 V=4\n");
  for (int pp : {2, 4, 8}) {
    for (int m : {pp, 2 * pp, 4 * pp}) {
      auto g = check_schedule(gpipe(pp, m)), f = check_schedule(one_f_one_b(pp, m));
      auto i2 = check_schedule(interleaved_1f1b(pp, m, 2)), i4 = check_schedule(interleaved_1f1b(pp, m, 4));
      std::printf("%2d %2d  %.3f  %.3f  %.3f           %.3f | %d %d %d %d\n", pp, m, g.bubble, f.bubble, i2.bubble,
                  i4.bubble, g.peak_in_flight[0], f.peak_in_flight[0], i2.peak_in_flight[0], i4.peak_in_flight[0]);
    }
  }
}
