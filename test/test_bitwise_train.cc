// Bitwise mode for training (docs/numerics.md "Bitwise mode"): with
// cfg.bitwise, every layout gives the one-device run's bits — the loss bits
// and the parameter hash after every step, dropout on — for the same global
// batch and micro-batch count.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "test/train/trace.h"
#include "train/metrics.h"
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

// `c` laid out as `l`.
TrainConfig on_layout(TrainConfig c, const Layout& l) {
  c.mesh = l.mesh;
  c.sequence_parallel = l.sp;
  c.zero = l.zero;
  c.pipeline_schedule = l.schedule;
  if (std::string(l.schedule) == "interleaved") c.virtual_stages = 2;
  return c;
}

std::string layout_name(const Layout& l) {
  return std::string(l.mesh) + (l.sp ? " + sp" : "") + (l.zero ? " zero=" + std::to_string(l.zero) : "") +
         (std::strstr(l.mesh, "pp") ? std::string(" ") + l.schedule : "");
}

// Runs `r` (the one-device reference) and then `r` on each layout.
void check_layouts(const TrainConfig& r, const std::vector<Layout>& layouts) {
  const std::string& model = r.model;
  const std::string& dtype = r.dtype;
  const int64_t micro_batches = r.micro_batches;
  const Trace ref = run(r);
  REQUIRE(ref.hashes.size() == size_t(steps()));
  for (const Layout& l : layouts) {
    const TrainConfig c = on_layout(r, l);
    const std::string what =
        model + " (" + dtype + "), " + std::to_string(micro_batches) + " micro-batches, on " + layout_name(l);
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

void check_layouts(const std::string& model, const std::vector<Layout>& layouts, int64_t micro_batches = 2,
                   int64_t n_layer = 0, const std::string& dtype = "float32") {
  TrainConfig r = base(model);
  r.dtype = dtype;
  r.micro_batches = micro_batches;
  if (n_layer > 0) r.n_layer = n_layer;
  check_layouts(r, layouts);
}

// Every value of the extra metric `key` that run `c` wrote to its metrics.jsonl, in step order.
std::vector<double> metric(const TrainConfig& c, const std::string& key) {
  std::vector<double> v;
  for (const StepMetrics& m : read_metrics(c.metrics_path()))
    if (const auto x = m.extra(key)) v.push_back(*x);
  return v;
}

double max_of(const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); }

}  // namespace

// Data and tensor parallelism, sequence parallelism, ZeRO-1/2 and FSDP.
const std::vector<Layout> kDpTpLayouts = {{"dp=2"},      {"tp=2"},           {"tp=2", true},     {"dp=2,tp=2"},
                                          {"dp=2,tp=2", true}, {"dp=2", false, 1}, {"dp=2", false, 2}, {"dp=2", false, 3}};

TEST_CASE("bitwise: dp, tp, sp, dp x tp, ZeRO-1/2, FSDP give the one-device bits every step", "[bitwise][train]") {
  for (std::string model : {"nanogpt", "llama"}) check_layouts(model, kDpTpLayouts);
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

// Compile mode (docs/compile.md): from step 4 on every rank replays its
// recorded step -- kernels, collectives, the dp gradient reduction -- and
// the run keeps the one-device eager bits. The replays are counted: a run
// that fell back to eager would pass the bit comparison without testing it.
TEST_CASE("bitwise: compile mode on dp, tp, sp, dp x tp, ZeRO-1/2, FSDP, cp, pp and float16 loss scaling replays with the one-device bits",
          "[bitwise][train][compile]") {
  for (std::string model : {"nanogpt", "llama"}) {
    for (const int64_t micro_batches : {int64_t(2), int64_t(1)}) {
      TrainConfig r = base(model);
      r.micro_batches = micro_batches;
      const Trace ref = run(r);
      std::vector<Layout> layouts = {{"dp=2"},           {"tp=2"},           {"tp=2", true},
                                     {"dp=2,tp=2", true}, {"dp=2", false, 1}, {"dp=2", false, 2},
                                     {"dp=2", false, 3},  {"dp=2,tp=2", true, 3}};
      for (const Layout& l : layouts) {
        TrainConfig c = on_layout(r, l);
        c.compile = true;
        const Trace got = run(c);
        INFO(model << ", " << micro_batches << " micro-batch(es), compiled on " << layout_name(l));
        INFO(got.compile.refused);
        CHECK(first_difference(ref, got) == "");
        CHECK(got.compile.refused.empty());
        CHECK(got.compile.replays == steps() - 3);
      }
    }
    TrainConfig one_sequence = base(model);  // cp: one sequence per rank and micro-batch
    one_sequence.batch_size = 2;
    const Trace ref = run(one_sequence);
    for (const char* mesh : {"cp=2", "tp=2,cp=2"}) {
      TrainConfig c = one_sequence;
      c.mesh = mesh;
      c.sequence_parallel = std::string(mesh) != "cp=2";
      c.compile = true;
      const Trace got = run(c);
      INFO(model << ", compiled on " << mesh);
      INFO(got.compile.refused);
      CHECK(first_difference(ref, got) == "");
      CHECK(got.compile.replays == steps() - 3);
    }
    // Pipelines: every rank records its stage's schedule (the p2p sends and
    // receives included) and replays it; the loss sums over pp are done
    // again after each replay.
    TrainConfig pipelined = base(model);
    pipelined.micro_batches = 4;
    pipelined.n_layer = 4;  // a block per stage with V = 2
    const Trace pp_ref = run(pipelined);
    for (const Layout& l : std::vector<Layout>{{"pp=2", false, 0, "gpipe"},
                                               {"pp=2"},
                                               {"pp=2", false, 0, "interleaved"},
                                               {"dp=2,pp=2"},
                                               {"tp=2,pp=2", true}}) {
      TrainConfig c = on_layout(pipelined, l);
      c.compile = true;
      const Trace got = run(c);
      INFO(model << ", 4 micro-batches, compiled on " << layout_name(l));
      INFO(got.compile.refused);
      CHECK(first_difference(pp_ref, got) == "");
      CHECK(got.compile.refused.empty());
      CHECK(got.compile.replays == steps() - 3);
    }
    // float16 with loss scaling: 2^20 overflows the first steps (skipped,
    // the scale halves each time), so the scale changes and the step records
    // again until it settles; then it replays, with the one-device bits.
    TrainConfig f16 = base(model);
    f16.dtype = "float16";
    f16.loss_scale = 1 << 20;
    const Trace f16_ref = run(f16);
    for (const Layout& l : std::vector<Layout>{{"dp=2,tp=2", true}, {"dp=2", false, 2}}) {
      TrainConfig c = on_layout(f16, l);
      c.compile = true;
      const Trace got = run(c);
      INFO(model << ", float16 with loss scaling, compiled on " << layout_name(l));
      INFO(got.compile.refused);
      CHECK(first_difference(f16_ref, got) == "");
      CHECK(got.compile.refused.empty());
      CHECK(got.compile.recaptures > 0);
      CHECK(got.compile.replays > 0);
    }
  }
}

// Compile mode on a model with MoE layers is mixed mode (its attention
// layers compiled, the MoE layers eager), on every layout Mixtral trains on
// -- FSDP included: the attention's recording reads the parameters FSDP's
// hooks gathered. Every attention call from the fourth replays.
TEST_CASE("bitwise: compile mode on Mixtral (mixed mode) on dp, ep, dp x ep, dp x tp + sp, ZeRO-2, FSDP replays with "
          "the one-device bits",
          "[bitwise][train][compile]") {
  const TrainConfig r = base("mixtral");
  const Trace ref = run(r);
  for (const Layout& l : std::vector<Layout>{{"dp=2"},
                                             {"ep=2"},
                                             {"dp=2,ep=2"},
                                             {"dp=2,tp=2", true},
                                             {"dp=2", false, 2},
                                             {"dp=2", false, 3},
                                             {"dp=2,ep=2", false, 3},
                                             {"dp=2,tp=2", true, 3}}) {
    TrainConfig c = on_layout(r, l);
    c.compile = true;
    const Trace got = run(c);
    INFO("mixtral compiled on " << layout_name(l));
    INFO(got.compile.modules.refused);
    CHECK(first_difference(ref, got) == "");
    CHECK(got.compile.modules.refused.empty());
    CHECK(got.compile.modules.modules == 2);
    CHECK(got.compile.modules.replayed == 2 * (2 * steps() - 3));  // 2 layers, 2 micro-batches per step
  }
}

// Context parallelism: sequences cut along time over "cp" (docs/distributed.md),
// alone and with every other dim; attention keeps its queries local.
// Micro-batches of one sequence per rank keep every piece local (attention
// on its own queries); micro-batches of several sequences per rank gather
// time for the weight gradients (the one-device order over (sequence,
// position)), so cp then gives the bits without dividing the work.
TEST_CASE("bitwise: context parallel (cp, cp x dp, cp x tp + sp, cp x pp, cp x ep, ZeRO-3) gives the one-device bits every step",
          "[bitwise][train][cp]") {
  for (std::string model : {"nanogpt", "llama", "mixtral"}) {
    TrainConfig one_sequence = base(model);  // per rank and micro-batch: with dp=2, 2 micro-batches of 2
    one_sequence.batch_size = 4;
    check_layouts(one_sequence, {{"dp=2,cp=2"}, {"cp=2,dp=2", false, 3}});
    one_sequence.batch_size = 2;
    std::vector<Layout> layouts = {{"cp=2"}, {"cp=4"}, {"tp=2,cp=2", true}, {"cp=2,pp=2"}};
    if (model == "mixtral") layouts.push_back({"ep=2,cp=2"});
    check_layouts(one_sequence, layouts);
  }
  check_layouts("llama", {{"cp=2"}, {"dp=2,cp=2"}});  // several sequences per micro-batch
}

// float16 autocast with dynamic loss scaling (the trainer's GradScaler):
// 2^20 overflows the first steps' float16 gradients; those steps are skipped
// on every layout alike (the inf flag is combined over the mesh), the scale
// halves each time, then training goes on.
TEST_CASE("bitwise: float16 with loss scaling, skipped steps included, on pp, dp x pp, dp, tp, dp x tp + sp, ZeRO-2, FSDP",
          "[bitwise][train][f16]") {
  for (std::string model : {"nanogpt", "llama"}) {
    TrainConfig r = base(model);
    r.dtype = "float16";
    r.loss_scale = 1 << 20;
    check_layouts(r, {{"pp=2", false, 0, "gpipe"},
                      {"dp=2,pp=2"},
                      {"dp=2"},
                      {"tp=2"},
                      {"dp=2,tp=2", true},
                      {"dp=2", false, 2},
                      {"dp=2", false, 3}});
    const std::vector<double> skipped = metric(r, "skipped"), scale = metric(r, "loss_scale");
    INFO(model);
    REQUIRE(skipped.size() == size_t(steps()));
    CHECK(skipped.front() == 1.0);  // 2^20 overflows float16
    CHECK(skipped.back() == 0.0);
    CHECK(scale.back() < scale.front());
  }
}

// Meshes with a dim of 3, and batches that do not split evenly: the
// training runs, not only the ops, give the one-device bits.
TEST_CASE("bitwise: meshes with a dim of 3 (dp, tp, dp x tp, pp) and uneven batches", "[bitwise][train][odd]") {
  for (std::string model : {"nanogpt", "llama"}) {
    TrainConfig r = base(model);
    r.batch_size = 12;  // 6 rows per micro-batch: 2 per dp rank
    r.n_layer = 3;      // a block per stage on pp=3
    check_layouts(r, {{"dp=3"}, {"dp=3,tp=2"}, {"pp=3", false, 0, "gpipe"}});
    TrainConfig heads3 = base(model);  // 3 heads of 16, 3 key/value heads: whole heads on tp=3
    heads3.dim = 48;
    heads3.n_head = 3;
    if (model == "llama") heads3.n_kv_head = 3;  // NanoGPT's follow n_head (no grouped heads)
    check_layouts(heads3, {{"tp=3"}, {"dp=2,tp=3"}});
    TrainConfig uneven = base(model);
    uneven.batch_size = 10;  // 5 rows per micro-batch: 2, 2 and 1 on dp=3
    check_layouts(uneven, {{"dp=3"}, {"dp=3", false, 2}});
    TrainConfig seven = base(model);
    seven.batch_size = 7;  // one micro-batch of 7 rows: 4 and 3 on dp=2
    seven.micro_batches = 1;
    check_layouts(seven, {{"dp=2"}, {"dp=2", false, 3}});
  }
}

// With a capacity factor the experts drop slots; which ones is decided in
// global token order, so every layout drops the one-device slots.
TEST_CASE("bitwise: Mixtral with capacity drops on dp, ep, dp x ep, ep x tp, pp", "[bitwise][train]") {
  for (const std::string dtype : {"float32", "bfloat16"}) {
    TrainConfig r = base("mixtral");
    r.capacity_factor = 0.5;
    r.dtype = dtype;
    check_layouts(r, {{"dp=2"}, {"ep=2"}, {"dp=2,ep=2"}, {"ep=2,tp=2"}, {"pp=2"}});
    INFO(dtype);
    // pp=2's drop counts and aux losses (the last run's metrics) are one
    // device's, and drops happened.
    TrainConfig one = r;
    one.out_dir += "_one_device";
    run(one);
    CHECK(metric(r, "moe_dropped_tokens") == metric(one, "moe_dropped_tokens"));
    CHECK(metric(r, "aux_loss") == metric(one, "aux_loss"));  // a float sum over the blocks, as one device
    CHECK(max_of(metric(one, "moe_dropped_tokens")) > 0);
  }
}

// The experts run whole in bitwise mode (their tp pieces gathered), so ep x tp
// gives the one-device bits too. With ep outside dp the non-expert weight
// gradients are pending over both; the dp sum is the buckets', so the ep
// reduction must not combine across ep first (dtensor/redistribute.cc).
TEST_CASE("bitwise: Mixtral on ep x tp, dp x ep x tp, and ep outside dp", "[bitwise][train]") {
  check_layouts("mixtral", {{"ep=2,tp=2"}, {"ep=2,tp=2", true}, {"dp=2,ep=2,tp=2"}, {"ep=2,dp=2"}, {"ep=2,tp=2,dp=2"}});
}

TEST_CASE("bitwise: interleaved 1F1B (4 blocks, 2 virtual stages per rank)", "[bitwise][train]") {
  for (std::string model : {"nanogpt", "llama"})
    check_layouts(model, {{"pp=2", false, 0, "interleaved"}, {"dp=2,pp=2", false, 0, "interleaved"}}, 4, 4);
}

// bfloat16 autocast (float32 master weights): the same layouts give the
// one-device bfloat16 run's bits. Ops whose pieces would be rounded to 16
// bits before they are summed run widened to float32 (dtensor/dist_call.h).
TEST_CASE("bitwise: bfloat16 autocast on dp, tp, sp, dp x tp, ZeRO-1/2, FSDP", "[bitwise][train][bf16]") {
  for (std::string model : {"nanogpt", "llama"}) check_layouts(model, kDpTpLayouts, 2, 0, "bfloat16");
}

TEST_CASE("bitwise: bfloat16 autocast on pipelines, Mixtral and 1 or 4 micro-batches", "[bitwise][train][bf16]") {
  for (std::string model : {"nanogpt", "llama"})
    check_layouts(model, {{"pp=2", false, 0, "gpipe"}, {"dp=2,pp=2"}, {"tp=2,pp=2", true}}, 2, 0, "bfloat16");
  check_layouts("mixtral", {{"dp=2"}, {"tp=2"}, {"ep=2"}, {"dp=2,ep=2"}, {"ep=2,tp=2"}, {"dp=2,ep=2,tp=2"}, {"pp=2"},
                            {"dp=2", false, 3}},
                2, 0, "bfloat16");
  for (int64_t m : {1, 4}) check_layouts("nanogpt", {{"dp=2"}, {"tp=2", true}, {"dp=2", false, 2}}, m, 0, "bfloat16");
}
