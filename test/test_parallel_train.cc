// nD-parallel training equals single-device training: for each model, 20
// steps (dropout on for NanoGPT) on data parallel, tensor parallel, tensor +
// sequence parallel and dp x tp meshes (the local backend: ranks as threads)
// give the single-device losses and final parameters within float tolerance.
// Bitwise equality is the bitwise-mode issue's job.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "autograd/api.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/config.h"
#include "test/train/trace.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::train;

namespace {

struct Run {
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::vector<double> dropped;  // moe_dropped_tokens per step (MoE models)
  std::vector<std::pair<std::string, Tensor>> params;
};

TrainConfig base(const std::string& model, const std::string& out) {
  TrainConfig c = testing::tiny_run(model, out);
  c.dropout = model == "nanogpt" ? 0.1 : -1;
  return c;
}

Run run(TrainConfig c) {
  Run r;
  TrainHooks h;
  h.quiet = true;
  h.keep_params = true;
  h.on_step = [&](const StepMetrics& m) {
    r.losses.push_back(*m.loss);
    r.grad_norms.push_back(*m.grad_norm);
    if (auto d = m.extra("moe_dropped_tokens")) r.dropped.push_back(*d);
  };
  r.params = run_training(c, h).final_params;
  return r;
}

std::string scratch(const std::string& name) {
  return (std::filesystem::path(tessel::testing::scratch_dir("parallel_train")) / name).string();
}

void check_same(const Run& ref, const Run& got, const std::string& what) {
  INFO(what);
  REQUIRE(got.losses.size() == ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(got.losses[i] == Approx(ref.losses[i]).epsilon(2e-5));
    CHECK(got.grad_norms[i] == Approx(ref.grad_norms[i]).epsilon(1e-4));
  }
  CHECK(got.dropped == ref.dropped);
  REQUIRE(got.params.size() == ref.params.size());
  for (size_t i = 0; i < ref.params.size(); ++i) {
    INFO("parameter " << ref.params[i].first);
    CHECK(got.params[i].first == ref.params[i].first);
    CHECK(testing::allclose(got.params[i].second, ref.params[i].second, 1e-4, 2e-5));
  }
}

}  // namespace

TEST_CASE("20 steps on dp2, tp2, tp2+sp, dp2xtp2 match one device", "[parallel][train]") {
  for (std::string model : {"nanogpt", "llama", "mixtral"}) {
    const Run ref = run(base(model, scratch(model + "_ref")));
    REQUIRE(ref.losses.size() == 20);
    CHECK(ref.losses.back() < ref.losses.front());
    struct Layout {
      const char* mesh;
      bool sp;
    };
    for (Layout l : {Layout{"dp=2", false}, Layout{"tp=2", false}, Layout{"tp=2", true}, Layout{"dp=2,tp=2", false},
                     Layout{"dp=2,tp=2", true}}) {
      TrainConfig c = base(model, scratch(model + "_par"));
      c.mesh = l.mesh;
      c.sequence_parallel = l.sp;
      check_same(ref, run(c), model + " on " + l.mesh + (l.sp ? " + sp" : ""));
    }
  }
}

TEST_CASE("20 steps context parallel (cp2, cp4, dp2xcp2, tp2xcp2 + sp, cp2xpp2, ep2xcp2) match one device",
          "[parallel][train][cp]") {
  for (std::string model : {"nanogpt", "llama", "mixtral"}) {
    const Run ref = run(base(model, scratch(model + "_cp_ref")));
    struct Layout {
      const char* mesh;
      bool sp;
    };
    std::vector<Layout> layouts = {{"cp=2", false}, {"cp=4", false}, {"dp=2,cp=2", false}, {"tp=2,cp=2", true},
                                   {"cp=2,pp=2", false}};
    if (model == "mixtral") layouts.push_back({"ep=2,cp=2", false});
    for (Layout l : layouts) {
      TrainConfig c = base(model, scratch(model + "_cp"));
      c.mesh = l.mesh;
      c.sequence_parallel = l.sp;
      if (std::string(l.mesh).find("pp") != std::string::npos) c.pipeline_schedule = "gpipe";
      check_same(ref, run(c), model + " on " + l.mesh + (l.sp ? " + sp" : ""));
    }
  }
}

TEST_CASE("20 steps with DDP, ZeRO-1, ZeRO-2 and FSDP match one device", "[parallel][train][zero]") {
  for (std::string model : {"nanogpt", "llama", "mixtral"}) {
    const Run ref = run(base(model, scratch(model + "_ref")));
    struct Layout {
      const char* mesh;
      int zero;
      bool sp;
    };
    for (Layout l : {Layout{"dp=2", 0, false}, Layout{"dp=2", 1, false}, Layout{"dp=2", 2, false},
                     Layout{"dp=2", 3, false}, Layout{"dp=2,tp=2", 3, false}, Layout{"dp=2,tp=2", 2, true},
                     Layout{"dp=2,tp=2", 3, true}}) {
      TrainConfig c = base(model, scratch(model + "_zero"));
      c.mesh = l.mesh;
      c.zero = l.zero;
      c.sequence_parallel = l.sp;
      c.ddp_bucket_mb = 0.02;  // several buckets
      check_same(ref, run(c), model + " on " + l.mesh + " zero=" + std::to_string(l.zero) + (l.sp ? " + sp" : ""));
    }
  }
}

TEST_CASE("Mixtral: 20 steps expert parallel (ep2, dp2xep2, ep2xtp2) match one device", "[parallel][train][ep]") {
  const Run ref = run(base("mixtral", scratch("mixtral_ep_ref")));
  REQUIRE(ref.dropped.size() == 20);
  CHECK(std::all_of(ref.dropped.begin(), ref.dropped.end(), [](double d) { return d == 0; }));
  for (const char* mesh : {"ep=2", "dp=2,ep=2", "ep=2,tp=2"}) {
    TrainConfig c = base("mixtral", scratch("mixtral_ep"));
    c.mesh = mesh;
    check_same(ref, run(c), std::string("mixtral on ") + mesh);
  }
}

TEST_CASE("Mixtral with a small capacity: drops counted, the same slots dropped on dp2, ep2 and dp2xep2",
          "[parallel][train][ep]") {
  TrainConfig c = base("mixtral", scratch("mixtral_cap_ref"));
  c.capacity_factor = 0.5;
  const Run ref = run(c);
  REQUIRE(ref.dropped.size() == 20);
  CHECK(ref.dropped.front() > 0);  // half the average load cannot fit
  for (const char* mesh : {"dp=2", "ep=2", "dp=2,ep=2"}) {
    c.out_dir = scratch("mixtral_cap");
    c.mesh = mesh;
    check_same(ref, run(c), std::string("mixtral, capacity factor 0.5, on ") + mesh);
  }
}

TEST_CASE("bad parallel settings fail before anything is written", "[parallel][train]") {
  auto expect = [](TrainConfig c, const std::string& needle) {
    std::string out = scratch("bad");
    c.out_dir = out;
    CHECK_THROWS_WITH(run_training(c, {nullptr, true}), Catch::Contains(needle));
    CHECK_FALSE(std::filesystem::exists(out));
  };
  TrainConfig c = base("nanogpt", "");
  c.steps = 1;
  TrainConfig bad = c;
  bad.mesh = "tp=3";
  expect(bad, "tp=3 does not divide n_head=4");
  bad = c;
  bad.mesh = "dp=2,tp";
  expect(bad, "'tp' is not NAME=SIZE");
  bad = c;
  bad.mesh = "dp=0";
  expect(bad, "must be a positive integer");
  bad = c;
  bad.mesh = "dp=2";
  bad.plan = "resnet";
  expect(bad, "unknown plan 'resnet'");
  bad = c;
  bad.mesh = "tp=2";
  bad.plan = tessel::testing::data_path("plan_unmatched.json");
  expect(bad, "matches no parameter");
  bad = c;
  bad.mesh = "ep=2";
  expect(bad, "expert parallelism (ep=2) needs a mixture-of-experts model (mixtral), got nanogpt");
  bad = c;
  bad.capacity_factor = 1.25;
  expect(bad, "capacity_factor 1.25 is set but the model has no mixture-of-experts layers");
  bad = c;
  bad.model = "mixtral";
  bad.mesh = "ep=3";
  expect(bad, "ep=3 does not divide num_experts=4");
  // Context parallelism: 2 x cp divides the sequence (load-balanced attention
  // segments); in bitwise mode into aligned subtrees of the canonical sum.
  bad = c;
  bad.mesh = "cp=3";
  expect(bad, "cp=3 needs seq_len divisible by 2 x cp = 6, got seq_len=16");
  bad = c;
  bad.mesh = "cp=2";
  bad.seq_len = 12;
  bad.bitwise = true;
  expect(bad, "bitwise mode with cp=2 cuts seq_len=12 into 4 segments of 3 positions, but a sum over a sequence runs "
              "in 16 canonical chunks of up to 1 position(s) combined by a balanced tree, and each segment must be one "
              "aligned subtree of it (4 consecutive chunks): pick a seq_len that is a multiple of 16, e.g. 16");
  bad = c;
  bad.mesh = "cp=3";
  bad.seq_len = 24;
  bad.bitwise = true;
  expect(bad, "bitwise mode needs 2 x cp to divide the 16 canonical chunks");
}
