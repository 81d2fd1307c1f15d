// Bitwise mode for training (docs/numerics.md "Bitwise mode"): with
// cfg.bitwise, every layout gives the one-device run's bits — the loss bits
// and the parameter hash after every step, dropout on — for the same global
// batch and micro-batch count.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "test/train/trace.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::train;

namespace {

int steps() {
  const char* e = std::getenv("TESSEL_BITWISE_STEPS");  // longer runs by hand
  return e ? std::atoi(e) : 20;
}

TrainConfig base(const std::string& model) {
  TrainConfig c;
  c.model = model;
  c.model_config = "tiny";
  c.steps = steps();
  c.batch_size = 8;
  c.seq_len = 16;
  c.micro_batches = 2;
  c.eval_every = 0;
  c.sample_length = 0;
  c.lr = 3e-3;
  c.min_lr = 3e-4;
  c.warmup_steps = 5;
  c.dropout = 0.1;  // dropout on in every model
  c.bitwise = true;
  c.out_dir = (std::filesystem::path(testing::scratch_dir("bitwise_train")) / model).string();
  return c;
}

using testing::first_difference;
using Trace = testing::StepTrace;
Trace run(const TrainConfig& c) { return testing::run_traced(c); }

struct Layout {
  const char* mesh;
  bool sp = false;
  int zero = 0;
  const char* schedule = "1f1b";
};

void check_layouts(const std::string& model, const std::vector<Layout>& layouts, int64_t micro_batches = 2,
                   int64_t n_layer = 0) {
  TrainConfig r = base(model);
  r.micro_batches = micro_batches;
  if (n_layer > 0) r.n_layer = n_layer;
  const Trace ref = run(r);
  REQUIRE(ref.hashes.size() == size_t(steps()));
  for (const Layout& l : layouts) {
    TrainConfig c = r;
    c.mesh = l.mesh;
    c.sequence_parallel = l.sp;
    c.zero = l.zero;
    c.pipeline_schedule = l.schedule;
    if (std::string(l.schedule) == "interleaved") c.virtual_stages = 2;
    const std::string what = model + ", " + std::to_string(micro_batches) + " micro-batches, on " + l.mesh + (l.sp ? " + sp" : "") +
                             (l.zero ? " zero=" + std::to_string(l.zero) : "") +
                             (std::strstr(l.mesh, "pp") ? std::string(" ") + l.schedule : "");
    std::string diff;
    try {
      diff = first_difference(ref, run(c));
    } catch (const std::exception& e) {
      diff = std::string("threw: ") + e.what();
    }
    INFO(what);
    CHECK(diff == "");
  }
}

}  // namespace

TEST_CASE("bitwise: dp, tp, sp, dp x tp, ZeRO-1/2, FSDP give the one-device bits every step", "[bitwise][train]") {
  for (std::string model : {"nanogpt", "llama"}) {
    check_layouts(model, {{"dp=2"},
                          {"tp=2"},
                          {"tp=2", true},
                          {"dp=2,tp=2"},
                          {"dp=2,tp=2", true},
                          {"dp=2", false, 1},
                          {"dp=2", false, 2},
                          {"dp=2", false, 3}});
  }
}

TEST_CASE("bitwise: pipeline (GPipe, 1F1B; with dp and tp) gives the one-device bits every step", "[bitwise][train]") {
  for (std::string model : {"nanogpt", "llama"})
    check_layouts(model, {{"pp=2", false, 0, "gpipe"}, {"pp=2"}, {"dp=2,pp=2"}, {"tp=2,pp=2", true}});
}

TEST_CASE("bitwise: 1 and 4 micro-batches (gradient accumulation) on dp, tp, ZeRO-2, pp", "[bitwise][train]") {
  for (int64_t m : {1, 4})
    check_layouts("nanogpt", {{"dp=2"}, {"tp=2", true}, {"dp=2", false, 2}, {"dp=2", false, 3}, {"pp=2", false, 0, "gpipe"}}, m);
}

TEST_CASE("bitwise: Mixtral on dp, tp, ep, dp x ep, pp, ZeRO-1/2, FSDP gives the one-device bits every step", "[bitwise][train]") {
  check_layouts("mixtral", {{"dp=2"},
                            {"tp=2"},
                            {"ep=2"},
                            {"dp=2,ep=2"},
                            {"pp=2"},
                            {"dp=2", false, 1},
                            {"dp=2", false, 2},
                            {"dp=2", false, 3}});
}

TEST_CASE("bitwise: ep x tp is refused up front (not covered yet)", "[bitwise][train]") {
  TrainConfig c = base("mixtral");
  c.mesh = "ep=2,tp=2";
  CHECK_THROWS_WITH(run(c), Catch::Contains("bitwise mode does not cover ep x tp"));
}

TEST_CASE("bitwise: interleaved 1F1B (4 blocks, 2 virtual stages per rank)", "[bitwise][train]") {
  for (std::string model : {"nanogpt", "llama"})
    check_layouts(model, {{"pp=2", false, 0, "interleaved"}, {"dp=2,pp=2", false, 0, "interleaved"}}, 4, 4);
}
