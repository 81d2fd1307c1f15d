// The public training API (run/run.h, run/checkpoint.h, run/launch.h) on a
// model written as a user writes one (test/run/mlp_classifier.h): the same
// loop on one device and on dp x tp meshes with DDP / ZeRO-1 / ZeRO-2 gives
// the one-device bits in bitwise mode; micro-batches; checkpoints saved on
// one layout and resumed on others; and every misuse the API can see is an
// error naming what is wrong.
#include <catch2/catch.hpp>

#include <cmath>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <optional>

#include "models/language_model.h"
#include "test/run/mlp_classifier.h"
#include "test/util/dist.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;
namespace fs = std::filesystem;

namespace {

// A layer without a bias, for column_parallel's hint.
struct NoBiasNet : nn::Module {
  std::shared_ptr<nn::Linear> proj;
  NoBiasNet() : nn::Module("NoBiasNet") { proj = child("proj", std::make_shared<nn::Linear>(8, 8, /*bias=*/false)); }
};

constexpr uint64_t kSeed = 7;
constexpr int64_t kBatch = 8;

uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

struct Trace {
  std::vector<double> loss;       // per step (the loss of rank 0's forward)
  std::vector<double> grad_norm;  // per step
  std::vector<bool> skipped;      // per step (loss scaling: an inf/NaN gradient)
  std::vector<double> loss_scale; // per step (1 without loss scaling)
  std::vector<std::pair<std::string, Tensor>> params;  // final, full
};

struct Layout {
  std::vector<Mesh::DimSpec> mesh;  // empty: one device
  RunOptions options;
  int64_t ranks() const {
    int64_t n = 1;
    for (const auto& d : mesh) n *= d.size;
    return n;
  }
};

struct TrainSpec {
  bool staged = false;  // StagedMlp (pipelines) with forward_backward
  bool on_meta = false; // build the model on Meta: parallelize creates and initialises only the local pieces
  MlpConfig model;
  int64_t steps = 12;
  std::string load_dir;   // load this checkpoint first
  std::string save_dir;   // save here after `save_at` steps
  int64_t save_at = -1;
  bool use_forward_backward = false;
};

template <class M>
std::shared_ptr<M> build(const TrainSpec& spec) {
  if (spec.on_meta) {
    nn::ConstructionScope meta(kMeta);
    return nn::make_model<M>(spec.model);
  }
  auto model = nn::make_model<M>(spec.model);
  model->reset_parameters(kSeed);
  return model;
}

// The user's loop: the same code for every layout.
template <class M>
Trace loop(Run<M> run, const TrainSpec& spec) {
  if (!spec.load_dir.empty()) load(spec.load_dir, run);
  Trace t;
  for (int64_t step = run.step(); step < spec.steps; ++step) {
    auto [xs, ys] = mlp_batch(spec.model, kBatch, kSeed, step);
    double loss = 0;
    if (spec.use_forward_backward || spec.staged) {
      loss = run.forward_backward(xs, ys).loss;
    } else if constexpr (std::is_same_v<M, MlpClassifier>) {
      // A loop of one's own opens its autocast scope (forward_backward does it from RunOptions::compute).
      std::optional<nn::AutocastScope> autocast;
      if (run.options().compute != DType::Float32) autocast.emplace(run.options().compute);
      Tensor l = run.model().loss(run.input(xs), run.input(ys));
      loss = l.item<double>();
      run.scale_loss(l).backward();  // l itself without loss scaling
    }
    t.loss.push_back(loss);
    const StepReport report = run.step_optimizer();
    t.grad_norm.push_back(report.grad_norm);
    t.skipped.push_back(report.skipped);
    t.loss_scale.push_back(report.loss_scale);
    if (run.step() == spec.save_at) save(spec.save_dir, run);
  }
  t.params = run.full_parameters();
  return t;
}

Trace train(const Layout& layout, const TrainSpec& spec) {
  Trace out;
  std::mutex mu;
  numerics::BitwiseGuard bitwise(true);
  launch(int(layout.ranks()), [&](int rank) {
    MeshPtr mesh = layout.mesh.empty() ? nullptr : Mesh::world(layout.mesh);
    RunOptions o = layout.options;
    o.seed = kSeed;
    Trace t = spec.staged ? loop(parallelize(build<StagedMlp>(spec), mesh, mlp_plan(), adamw({1e-2}), o), spec)
                          : loop(parallelize(build<MlpClassifier>(spec), mesh, mlp_plan(), adamw({1e-2}), o), spec);
    if (rank == 0) {
      std::lock_guard<std::mutex> lk(mu);
      out = std::move(t);
    }
  });
  return out;
}

void require_same_bits(const Trace& a, const Trace& b, size_t a_from = 0) {
  REQUIRE(a.loss.size() >= a_from + b.loss.size());
  for (size_t i = 0; i < b.loss.size(); ++i) {
    INFO("step " << a_from + i + 1);
    REQUIRE(bits(float(a.loss[a_from + i])) == bits(float(b.loss[i])));
    REQUIRE(a.loss[a_from + i] == b.loss[i]);
    REQUIRE((a.grad_norm[a_from + i] == b.grad_norm[i] || (std::isnan(a.grad_norm[a_from + i]) && std::isnan(b.grad_norm[i]))));
    REQUIRE(a.skipped[a_from + i] == b.skipped[i]);
    REQUIRE(a.loss_scale[a_from + i] == b.loss_scale[i]);
  }
  REQUIRE(a.params.size() == b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    INFO(a.params[i].first);
    REQUIRE(a.params[i].first == b.params[i].first);
    REQUIRE(bitwise_equal(a.params[i].second, b.params[i].second));
  }
}

std::string fresh_dir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path p = fs::path(tmp ? tmp : "/tmp") / ("test_run_" + name);
  fs::remove_all(p);
  return p.string();
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// Runs fn on n ranks (threads) and returns each rank's error message
// ("(no error)" when it returned): assertions stay on the test's thread
// (Catch2 is not thread-safe).
std::vector<std::string> errors_on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> out(size_t(n), "(no error)");
  comm::run_local(n, [&](int rank) { out[size_t(rank)] = error_of([&] { fn(rank); }); });
  return out;
}

}  // namespace

TEST_CASE("run: the same loop on dp x tp with DDP, ZeRO-1, ZeRO-2 gives the one-device bits", "[run]") {
  TrainSpec spec;
  const Trace one = train({}, spec);
  REQUIRE(one.loss.size() == size_t(spec.steps));
  CHECK(one.loss.back() < one.loss.front());  // it learns
  for (int zero : {0, 1, 2}) {
    for (const auto& mesh : std::vector<std::vector<Mesh::DimSpec>>{{{"dp", 2}}, {{"tp", 2}}, {{"dp", 2}, {"tp", 2}}}) {
      Layout l{mesh, {}};
      l.options.zero = zero;
      l.options.clip = 0.5;
      INFO("zero " << zero << " mesh ranks " << l.ranks());
      Layout ref{{}, {}};
      ref.options.clip = 0.5;
      require_same_bits(train(ref, spec), train(l, spec));
    }
  }
}

// Autocast (RunOptions::compute): the matmuls in 16 bits, float32 master
// weights. Bitwise mode runs the ops whose pieces would be rounded before
// they are summed (row-parallel products, weight and bias gradients over dp)
// widened to float32, so every layout keeps the one-device 16-bit bits.
TEST_CASE("run: bfloat16 and float16 autocast on dp, tp, dp x tp, ZeRO-2 and FSDP give the one-device bits",
          "[run][autocast]") {
  TrainSpec spec;
  for (DType compute : {DType::BFloat16, DType::Float16}) {
    Layout ref{{}, {}};
    ref.options.compute = compute;
    ref.options.clip = 0.5;
    const Trace one = train(ref, spec);
    REQUIRE(one.loss.size() == size_t(spec.steps));
    CHECK(one.loss.back() < one.loss.front());
    for (const auto& [mesh, zero] : std::vector<std::pair<std::vector<Mesh::DimSpec>, int>>{
             {{{"dp", 2}}, 0}, {{{"tp", 2}}, 0}, {{{"dp", 2}, {"tp", 2}}, 0}, {{{"dp", 2}, {"tp", 2}}, 2},
             {{{"dp", 2}}, 3}}) {
      Layout l{mesh, ref.options};
      l.options.zero = zero;
      INFO(dtype_name(compute) << " on " << l.ranks() << " ranks, zero " << zero);
      require_same_bits(one, train(l, spec));
    }
  }
}

// float16 with dynamic loss scaling: an initial scale of 2^20 overflows the
// first steps' float16 gradients, which are skipped on every rank and every
// layout alike (the inf flag is combined over the mesh); a checkpoint keeps
// the scale, so a resumed run skips and scales as the uninterrupted one.
TEST_CASE("run: float16 loss scaling skips the same steps on every layout, and resumes its scale", "[run][autocast]") {
  TrainSpec spec;
  Layout ref{{}, {}};
  ref.options.compute = DType::Float16;
  nn::GradScalerOptions scaling;
  scaling.init_scale = 1 << 20;
  ref.options.loss_scaling = scaling;
  const Trace one = train(ref, spec);
  REQUIRE(one.skipped.size() == size_t(spec.steps));
  CHECK(one.skipped.front());   // 2^20 overflows float16
  CHECK_FALSE(one.skipped.back());  // the scale came down; training goes on
  CHECK(one.loss_scale.back() < one.loss_scale.front());
  CHECK(one.loss.back() < one.loss.front());
  for (const auto& [mesh, zero] : std::vector<std::pair<std::vector<Mesh::DimSpec>, int>>{
           {{{"dp", 2}}, 0}, {{{"tp", 2}}, 0}, {{{"dp", 2}, {"tp", 2}}, 2}, {{{"dp", 2}}, 3}}) {
    Layout l{mesh, ref.options};
    l.options.zero = zero;
    INFO(l.ranks() << " ranks, zero " << zero);
    require_same_bits(one, train(l, spec));
  }
  // Saved at step 6 on dp=2, resumed on one device: the same steps from 7 on.
  TrainSpec first = spec;
  first.save_dir = fresh_dir("loss_scaling");
  first.save_at = 6;
  require_same_bits(one, train(Layout{{{"dp", 2}}, ref.options}, first));
  TrainSpec second = spec;
  second.load_dir = first.save_dir;
  require_same_bits(one, train(ref, second), 6);
  // A staged model through forward_backward: one device, pp=2 and dp=2 x pp=2
  // (the pipeline scales each micro-batch's backward root; the stages agree
  // on skipping).
  TrainSpec staged = spec;
  staged.staged = true;
  Layout ref_mb = ref;
  ref_mb.options.micro_batches = 2;  // 1F1B needs at least pp micro-batches
  const Trace one_staged = train(ref_mb, staged);
  CHECK(one_staged.skipped.front());
  CHECK_FALSE(one_staged.skipped.back());
  for (const auto& mesh : std::vector<std::vector<Mesh::DimSpec>>{{{"pp", 2}}, {{"dp", 2}, {"pp", 2}}}) {
    Layout l{mesh, ref_mb.options};
    INFO("staged on " << l.ranks() << " ranks");
    require_same_bits(one_staged, train(l, staged));
  }
  // A checkpoint saved with loss scaling does not load into a run without it.
  Layout plain{{}, {}};
  plain.options.compute = DType::Float16;
  CHECK_THROWS_WITH(train(plain, second), Catch::Contains("was saved with loss scaling but this run has none"));
}

TEST_CASE("run: loss scaling refuses an unscaled backward", "[run][autocast][errors]") {
  RunOptions o;
  o.compute = DType::Float16;
  o.loss_scaling = nn::GradScalerOptions{};
  const MlpConfig cfg;
  auto model = nn::make_model<MlpClassifier>(cfg);
  model->reset_parameters(kSeed);
  auto run = parallelize(model, nullptr, mlp_plan(), adamw({1e-2}), o);
  CHECK(run.loss_scale() == 65536.0);  // GradScalerOptions' default
  auto [xs, ys] = mlp_batch(cfg, kBatch, kSeed, 0);
  const std::string e = error_of([&] { run.model().loss(xs, ys).backward(); });
  CHECK(contains(e, "without run.scale_loss"));
  CHECK(contains(e, "RunOptions::loss_scaling"));
  const Tensor l = run.model().loss(xs, ys);
  CHECK(run.scale_loss(l).item<double>() == l.item<double>() * 65536.0);
  // A float16 loss would overflow once scaled: refused, with the fix.
  const std::string e16 = error_of([&] { run.scale_loss(l.to(DType::Float16)); });
  CHECK(contains(e16, "is float16"));
  CHECK(contains(e16, "cast_up(logits)"));
}

TEST_CASE("run: a staged model on pipelines (pp=2, dp=2 x pp=2, tp=2 x pp=2) gives the one-device bits", "[run][pp]") {
  TrainSpec spec;
  spec.staged = true;
  spec.steps = 8;
  Layout one{{}, {}};
  one.options.micro_batches = 2;
  one.options.clip = 0.5;
  const Trace ref = train(one, spec);
  CHECK(ref.loss.back() < ref.loss.front());
  for (const auto& mesh : std::vector<std::vector<Mesh::DimSpec>>{
           {{"pp", 2}}, {{"dp", 2}, {"pp", 2}}, {{"pp", 2}, {"tp", 2}}}) {
    for (const char* schedule : {"1f1b", "gpipe"}) {
      Layout l{mesh, one.options};
      l.options.pipeline_schedule = schedule;
      INFO(schedule << " on " << l.ranks() << " ranks");
      require_same_bits(ref, train(l, spec));
    }
  }
  TrainSpec meta = spec;
  meta.on_meta = true;  // each stage creates and initialises only what it holds
  require_same_bits(ref, train(Layout{{{"pp", 2}}, one.options}, meta));
}

TEST_CASE("run: a model built on Meta is materialised piece by piece with the one-device values", "[run]") {
  TrainSpec spec, meta;
  meta.on_meta = true;
  Layout l{{{"dp", 2}, {"tp", 2}}, {}};
  l.options.zero = 2;
  require_same_bits(train({}, spec), train(l, meta));
}

TEST_CASE("run: FSDP on a model whose entry point is loss(x, y): units or none, blocks hooked or not", "[run][fsdp]") {
  TrainSpec spec;
  spec.steps = 10;
  Layout one{{}, {}};
  one.options.clip = 0.5;
  const Trace ref = train(one, spec);
  for (const char* units : {"", "blocks\\.\\d+"}) {
    for (bool hooks : {false, true}) {
      for (const auto& mesh : std::vector<std::vector<Mesh::DimSpec>>{{{"dp", 2}}, {{"dp", 2}, {"tp", 2}}}) {
        TrainSpec s = spec;
        s.model.call_blocks_through_hooks = hooks;
        Layout l{mesh, one.options};
        l.options.zero = 3;
        l.options.fsdp_units = units;
        INFO("units '" << units << "', blocks through hooks " << hooks << ", " << l.ranks() << " ranks");
        require_same_bits(ref, train(l, s));
      }
    }
  }
  // A staged model's blocks are its units by default; with micro-batches.
  TrainSpec staged = spec;
  staged.staged = true;
  Layout mb{{}, one.options};
  mb.options.micro_batches = 2;
  const Trace staged_ref = train(mb, staged);
  Layout fsdp{{{"dp", 2}, {"tp", 2}}, mb.options};
  fsdp.options.zero = 3;
  require_same_bits(staged_ref, train(fsdp, staged));
}

TEST_CASE("run: blocks called through their hooks or directly, the same bits", "[run]") {
  TrainSpec direct, hooks;
  hooks.model.call_blocks_through_hooks = true;
  Layout l{{{"dp", 2}, {"tp", 2}}, {}};
  l.options.zero = 2;
  require_same_bits(train({}, direct), train(l, hooks));
}

TEST_CASE("run: micro-batches (forward_backward, gradient accumulation) equal one device", "[run]") {
  TrainSpec spec;
  spec.use_forward_backward = true;
  spec.steps = 8;
  Layout one{{}, {}};
  one.options.micro_batches = 2;
  const Trace ref = train(one, spec);
  Layout dp{{{"dp", 2}, {"tp", 2}}, {}};
  dp.options.micro_batches = 2;
  dp.options.zero = 2;
  require_same_bits(ref, train(dp, spec));
  // One micro-batch of the whole batch is another computation (other
  // dropout slices, another reduction split): not the same bits, but close.
  const Trace whole = train({}, spec);
  CHECK(whole.loss[0] == Approx(ref.loss[0]).epsilon(0.05));
}

TEST_CASE("run: checkpoint at step 6 on dp=2 x tp=2 (ZeRO-2), resumed on tp=2 and on one device", "[run][ckpt]") {
  TrainSpec spec;
  const Trace one = train({}, spec);
  TrainSpec first = spec;
  first.save_dir = fresh_dir("ckpt");
  first.save_at = 6;
  Layout saver{{{"dp", 2}, {"tp", 2}}, {}};
  saver.options.zero = 2;
  require_same_bits(one, train(saver, first));
  for (const Layout& resume : {Layout{{{"tp", 2}}, {}}, Layout{{}, {}}, Layout{{{"dp", 2}}, {1}}}) {
    TrainSpec second = spec;
    second.load_dir = first.save_dir;
    const Trace rest = train(resume, second);
    REQUIRE(rest.loss.size() == 6);
    require_same_bits(one, rest, 6);
  }
}

TEST_CASE("run: a checkpoint of another model is refused whole; the run is left as it was", "[run][ckpt][errors]") {
  TrainSpec spec;
  spec.steps = 2;
  spec.save_dir = fresh_dir("other");
  spec.save_at = 2;
  train({}, spec);
  for (int variant = 0; variant < 3; ++variant) {
    MlpConfig c;
    if (variant == 0) c.dim = 8;       // shapes differ
    if (variant == 1) c.n_blocks = 3;  // a tensor the checkpoint lacks
    if (variant == 2) c.n_blocks = 1;  // tensors the model lacks
    auto model = nn::make_model<MlpClassifier>(c);
    model->reset_parameters(kSeed);
    RunOptions o;
    o.seed = kSeed;
    auto run = parallelize(model, adamw({1e-2}), o);
    const Tensor before = model->embed->weight.clone();
    const std::string e = error_of([&] { load(spec.save_dir, run); });
    INFO(e);
    CHECK(contains(e, spec.save_dir));
    if (variant == 0) CHECK(contains(e, "'model.embed.weight' is float32 [16, 12] but this MlpClassifier's is float32 [8, 12]"));
    if (variant == 1) CHECK(contains(e, "has no tensor 'model.blocks.2.norm.weight' that this MlpClassifier has"));
    if (variant == 2) CHECK(contains(e, "holds tensor 'model.blocks.1.fc1.bias' that this MlpClassifier does not have"));
    CHECK(bitwise_equal(model->embed->weight, before));
    CHECK(run.step() == 0);
  }
  // Another optimizer: refused before anything is written.
  {
    auto model = nn::make_model<MlpClassifier>(MlpConfig{});
    model->reset_parameters(kSeed);
    RunOptions o;
    o.seed = kSeed;
    auto run = parallelize(model, sgd(), o);
    const Tensor before = model->embed->weight.clone();
    const std::string e = error_of([&] { load(spec.save_dir, run); });
    INFO(e);
    CHECK(contains(e, "holds the state of a AdamW optimizer but this run's optimizer is SGD"));
    CHECK(bitwise_equal(model->embed->weight, before));
    CHECK(run.step() == 0);
  }
  // Another seed: dropout and data would differ.
  auto model = nn::make_model<MlpClassifier>(MlpConfig{});
  auto run = parallelize(model, adamw({1e-2}), RunOptions{});
  CHECK(contains(error_of([&] { load(spec.save_dir, run); }), "was trained with seed 7 but this run has seed 0"));
}

TEST_CASE("run: the optimizer state is created on load even before the first step", "[run][ckpt]") {
  TrainSpec spec;
  spec.steps = 3;
  spec.save_dir = fresh_dir("optstate");
  spec.save_at = 3;
  train({}, spec);
  auto model = nn::make_model<MlpClassifier>(MlpConfig{});
  RunOptions o;
  o.seed = kSeed;
  auto run = parallelize(model, adamw({1e-2}), o);
  for (const auto& nt : run.optimizer().state_dict()) CHECK(nt.name == "step");  // no per-parameter state yet
  const nlohmann::json extra = load(spec.save_dir, run);
  CHECK(extra.empty());
  CHECK(run.step() == 3);
  CHECK(run.optimizer().num_steps() == 3);
  const auto st = run.optimizer().state_dict();
  bool found = false;
  for (const auto& nt : st) found = found || nt.name == "embed.weight.exp_avg_sq";
  CHECK(found);
}

TEST_CASE("run: extra state round trip; reserved keys refused", "[run][ckpt]") {
  auto model = nn::make_model<MlpClassifier>(MlpConfig{});
  auto run = parallelize(model, adamw({1e-2}), RunOptions{});
  const std::string dir = fresh_dir("extra");
  CHECK(contains(error_of([&] { save(dir, run, {{"step", 3}}); }), "extra key 'step' is reserved"));
  save(dir, run, {{"loader", {{"epoch", 2}}}});
  CHECK(load(dir, run)["loader"]["epoch"] == 2);
}

TEST_CASE("run: Checkpoints keeps step-N folders, resumes the newest, prunes", "[run][ckpt]") {
  const std::string root = fresh_dir("root");
  auto model = nn::make_model<MlpClassifier>(MlpConfig{});
  model->reset_parameters(1);  // (unset, a system allocator's memory is whatever it was: NaN under --tsan)
  auto run = parallelize(model, adamw({1e-2}), RunOptions{});
  Checkpoints ckpt(root, {/*every=*/2, /*keep_last=*/2, /*async=*/true});
  CHECK_FALSE(ckpt.resume(run).has_value());
  for (int64_t step = 0; step < 7; ++step) {
    auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, step);
    run.model().loss(x, y).backward();
    run.step_optimizer();
    CHECK(ckpt.after_step(run, step == 6) == (run.step() % 2 == 0 || step == 6));
  }
  wait_for_save(run);
  CHECK(fs::exists(root + "/step-00000007"));
  CHECK(fs::exists(root + "/step-00000006"));
  CHECK_FALSE(fs::exists(root + "/step-00000004"));
  auto model2 = nn::make_model<MlpClassifier>(MlpConfig{});
  auto run2 = parallelize(model2, adamw({1e-2}), RunOptions{});
  CHECK(ckpt.resume(run2).has_value());
  CHECK(run2.step() == 7);
  CHECK(bitwise_equal(model2->head->weight, model->head->weight));
}

TEST_CASE("run: misuse is an error naming what is wrong", "[run][errors]") {
  SECTION("an optimizer built over the parameters before parallelize") {
    for (const std::string& e : errors_on_ranks(2, [](int) {
           auto model = nn::make_model<MlpClassifier>(MlpConfig{});
           model->reset_parameters(1);
           nn::AdamW early(model->parameters(), {});
           auto run = parallelize(model, Mesh::world({{"tp", 2}}), mlp_plan(), adamw({1e-2}), {});
           auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
           run.model().loss(run.input(x), run.input(y)).backward();
           early.step();
         })) {
      INFO(e);
      CHECK(contains(e, "is no longer the model's: tessel::parallelize replaced it"));
      CHECK(contains(e, "Build the optimizer after laying the model out"));
    }
  }
  SECTION("a loss function of one's own on a pipeline (which would not run it)") {
    for (const std::string& e : errors_on_ranks(2, [](int) {
           const RunLossFn own = [](nn::Module& m, const Tensor& x, const Tensor& y) {
             auto& staged = static_cast<nn::StagedModel&>(m);
             return staged.loss(staged.forward(x), y) * Scalar(2.0);
           };
           RunOptions o;
           o.micro_batches = 2;
           auto run = parallelize(build<StagedMlp>(TrainSpec{}), Mesh::world({{"pp", 2}}), mlp_plan(), adamw(), o, own);
         })) {
      INFO(e);
      CHECK(contains(e, "has a 'pp' dim and StagedMlp was given a loss function of its own"));
      CHECK(contains(e, "put the loss in StagedMlp's stage_loss"));
    }
    // The default (the model's loss) builds the pipeline.
    for (const std::string& e : errors_on_ranks(2, [](int) {
           RunOptions o;
           o.micro_batches = 2;
           auto run = parallelize(build<StagedMlp>(TrainSpec{}), Mesh::world({{"pp", 2}}), mlp_plan(), adamw(), o);
         }))
      CHECK(e == "(no error)");
  }
  SECTION("a parameter added after parallelize") {
    struct Growing : MlpClassifier {
      using MlpClassifier::MlpClassifier;
      void grow() { extra = child("extra", std::make_shared<nn::Linear>(2, 2)); }
      std::shared_ptr<nn::Linear> extra;
    };
    auto model = nn::make_model<Growing>(MlpConfig{});
    auto run = parallelize(model, adamw({1e-2}), RunOptions{});
    model->grow();
    auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
    run.model().loss(x, y).backward();
    const std::string e = error_of([&] { run.step_optimizer(); });
    INFO(e);
    CHECK(contains(e, "parameter 'extra.weight' (Tensor(float32"));
    CHECK(contains(e, "was added to MlpClassifier after tessel::parallelize"));
  }
  SECTION("a model whose parameters were never set (no reset_parameters, no load)") {
    // New parameters are NaN until set; whatever the allocator held before
    // used to train silently.
    // (The check is at the first update: parallelize, then load, is a resume.)
    for (const std::string& e : errors_on_ranks(2, [](int) {
           auto model = nn::make_model<MlpClassifier>(MlpConfig{});
           auto run = parallelize(model, Mesh::world({{"tp", 2}}), mlp_plan(), adamw(), {});
           auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
           run.model().loss(run.input(x), run.input(y)).backward();
           run.step_optimizer();
         })) {
      INFO(e);
      CHECK(contains(e, "parameter 'embed.weight' of MlpClassifier"));
      CHECK(contains(e, "never set"));
      CHECK(contains(e, "reset_parameters(seed)"));
    }
    auto one = nn::make_model<MlpClassifier>(MlpConfig{});
    CHECK(std::isnan(one->parameters()[0].to_vector<float>()[0]));
    auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
    {
      auto run = parallelize(one, adamw(), RunOptions{});
      run.forward_backward(x, y);
      const std::string e = error_of([&] { run.step_optimizer(); });
      INFO(e);
      CHECK(contains(e, "never set"));
    }
    auto two = nn::make_model<MlpClassifier>(MlpConfig{});
    two->reset_parameters(3);
    auto run = parallelize(two, adamw(), RunOptions{});
    run.forward_backward(x, y);
    CHECK_NOTHROW(run.step_optimizer());
  }
  SECTION("a plan rule naming modules the model lacks") {
    for (const std::string& e : errors_on_ranks(2, [](int) {
           parallel::ParallelPlan plan = mlp_plan();
           plan.column_parallel("layers\\.\\d+\\.fc1");
           auto model = nn::make_model<MlpClassifier>(MlpConfig{});
           parallelize(model, Mesh::world({{"tp", 2}}), plan, adamw(), {});
         })) {
      INFO(e);
      CHECK(contains(e, "layers\\.\\d+\\.fc1\\.weight"));
      CHECK(contains(e, "matches no parameter"));
    }
  }
  SECTION("column_parallel on a Linear without a bias says how to mark it") {
    for (const std::string& e : errors_on_ranks(2, [](int) {
           parallel::ParallelPlan plan;
           plan.column_parallel("proj");
           parallelize(std::make_shared<NoBiasNet>(), Mesh::world({{"tp", 2}}), plan, adamw(), {});
         })) {
      INFO(e);
      CHECK(contains(e, "parameter rule 'proj\\.bias' matches no parameter of the model -- it was made by "
                        "column_parallel(\"proj\")"));
      CHECK(contains(e, "call column_parallel(\"proj\", /*bias=*/false)"));
    }
  }
  SECTION("a mesh dim the plan does not know") {
    for (const std::string& e : errors_on_ranks(2, [](int) {
           auto model = nn::make_model<MlpClassifier>(MlpConfig{});
           parallelize(model, Mesh::world({{"xp", 2}}), mlp_plan(), adamw(), {});
         })) {
      INFO(e);
      CHECK(contains(e, "mesh (xp=2): dim 'xp' (size 2) means nothing to MlpClassifier's run"));
      CHECK(contains(e, "plan 'mlp-tp' lays parameters or modules out on tp, its data layout cuts the batch over cp, dp, ep"));
    }
  }
  SECTION("context parallelism (cp) with a model without attention: an error before the first update") {
    for (const std::string& e : errors_on_ranks(2, [](int) {
           auto model = nn::make_model<MlpClassifier>(MlpConfig{});
           auto run = parallelize(model, Mesh::world({{"cp", 2}}), mlp_plan(), adamw(), {});
           auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
           run.forward_backward(x, y);
           run.step_optimizer();
         })) {
      INFO(e);
      CHECK(contains(e, "mesh (cp=2): the cp dim (size 2) cuts each sequence along time"));
      CHECK(contains(e, "MlpClassifier's first step ran no attention on distributed inputs"));
    }
  }
  SECTION("context parallelism (cp) without run.input: an error before the first update") {
    for (const std::string& e : errors_on_ranks(2, [](int) {
           std::shared_ptr<models::LanguageModel> model = models::build_model(models::model_config("llama", "tiny"));
           model->reset_parameters(1);
           auto run = parallelize(model, Mesh::world({{"cp", 2}}), parallel::builtin_plan("llama"), adamw(), {});
           Tensor ids = randint({1, 17}, 5, 0, 200);
           run.model().loss(run.model().forward(ids.narrow(1, 0, 16)), ids.narrow(1, 1, 16)).backward();
           run.step_optimizer();
         })) {
      INFO(e);
      CHECK(contains(e, "mesh (cp=2): Llama's first step ran without run.input(): every cp rank computed the whole "
                        "sequences"));
    }
  }
  SECTION("backward twice without a step; a step without a backward") {
    auto model = nn::make_model<MlpClassifier>(MlpConfig{});
    model->reset_parameters(1);  // parameters are created uninitialised: a step on them may see a NaN norm
    auto run = parallelize(model, adamw({1e-2}), RunOptions{});
    auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
    run.model().loss(x, y).backward();
    const std::string e = error_of([&] { run.model().loss(x, y).backward(); });
    INFO(e);
    CHECK(contains(e, "backward pass 2 of step 1 of MlpClassifier, but micro_batches = 1"));
    run.step_optimizer();
    const std::string e2 = error_of([&] { run.step_optimizer(); });
    INFO(e2);
    CHECK(contains(e2, "step_optimizer after 0 backward pass(es) in step 2"));
  }
  SECTION("each rank passing its own rows instead of the global batch") {
    for (const std::string& e : errors_on_ranks(2, [](int rank) {
           auto model = nn::make_model<MlpClassifier>(MlpConfig{});
           auto run = parallelize(model, Mesh::world({{"dp", 2}}), mlp_plan(), adamw(), {});
           auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
           run.input(x.narrow(0, rank * 4, 4));  // a PyTorch-DDP habit: this rank's rows
         })) {
      INFO(e);
      CHECK(contains(e, "input: the ranks passed different tensors"));
      CHECK(contains(e, "run.input takes the GLOBAL batch"));
    }
    // Turned off, the same call goes through (the user vouches for the data).
    RunOptions o;
    o.check_inputs = false;
    for (const std::string& e : errors_on_ranks(2, [&](int rank) {
           auto model = nn::make_model<MlpClassifier>(MlpConfig{});
           auto run = parallelize(model, Mesh::world({{"dp", 2}}), mlp_plan(), adamw(), o);
           auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
           run.input(x.narrow(0, rank * 4, 4));
         }))
      CHECK(e == "(no error)");
  }
  SECTION("a mesh of another size than the job") {
    for (const std::string& e : errors_on_ranks(2, [](int) {
           auto model = nn::make_model<MlpClassifier>(MlpConfig{});
           parallelize(model, Mesh::single(), mlp_plan(), adamw(), {});
         })) {
      INFO(e);
      CHECK(contains(e, "mesh (world=1) has 1 devices but the job has 2 ranks"));
    }
  }
  SECTION("bad options") {
    auto model = nn::make_model<MlpClassifier>(MlpConfig{});
    RunOptions o;
    o.zero = 4;
    CHECK(contains(error_of([&] { parallelize(model, adamw(), o); }), "zero must be 0 (DDP), 1, 2 or 3 (FSDP), got 4"));
    o = {};
    o.fsdp_units = "nothing";
    for (const std::string& e : errors_on_ranks(2, [&](int) {
           auto m = nn::make_model<MlpClassifier>(MlpConfig{});
           parallelize(m, Mesh::world({{"dp", 2}}), mlp_plan(), adamw(), o);
         }))
      CHECK(contains(e, "RunOptions::fsdp_units 'nothing' matches no module of MlpClassifier (modules: embed, blocks"));
  }
}

TEST_CASE("run: launch gives every rank the caller's bitwise mode and runs SPMD", "[run]") {
  std::atomic<int> bitwise_ranks{0};
  {
    numerics::BitwiseGuard g(true);
    launch(3, [&](int) {
      if (numerics::bitwise()) ++bitwise_ranks;
    });
  }
  CHECK(bitwise_ranks == 3);
  int ran = -1;
  launch(1, [&](int r) { ran = r; });
  CHECK(ran == 0);
  for (const std::string& e : errors_on_ranks(2, [](int) { launch(4, [](int) {}); }))
    CHECK(contains(e, "asked for 4 ranks but this job has 2 (local backend)"));
}

TEST_CASE("run: sgd, describe, memory, forward, input layouts", "[run]") {
  // SGD through the spec: one step moves the weights by -lr * grad (no momentum, no decay).
  auto model = nn::make_model<MlpClassifier>(MlpConfig{});
  model->reset_parameters(1);
  nn::SGDOptions so;
  so.lr = 0.5;
  auto run = parallelize(model, sgd(so), RunOptions{});
  CHECK(run.optimizer().name() == "SGD");
  CHECK(run.describe() == "one device");
  const Tensor before = model->head->weight.detach().clone();
  auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
  run.model().loss(x, y).backward();
  const Tensor grad = model->head->weight.grad().clone();
  run.step_optimizer();
  CHECK(bitwise_equal(model->head->weight.detach(), before - grad * 0.5));
  const auto mem = run.memory();
  CHECK(mem.params == int64_t(model->num_parameters()) * 4);
  CHECK(contains(error_of([&] { run.forward(x); }), "forward needs an nn::StagedModel"));

  // A staged model's forward, on a mesh: every rank the one-device output.
  TrainSpec spec;
  spec.steps = 0;
  auto staged = build<StagedMlp>(spec);
  Tensor expected;
  {
    NoGradGuard ng;
    staged->eval();
    expected = staged->forward(x);
  }
  std::vector<Tensor> outs(4);
  std::vector<std::string> described(4), default_layout(4), tp_rows(4), bad_layout(4);
  comm::run_local(4, [&](int rank) {
    auto m = build<StagedMlp>(spec);
    m->eval();
    RunOptions o;
    o.zero = 2;
    auto r = parallelize(m, Mesh::world({{"dp", 2}, {"tp", 2}}), mlp_plan(), adamw(), o);
    described[size_t(rank)] = r.describe();
    outs[size_t(rank)] = full_tensor(r.forward(x));
    default_layout[size_t(rank)] = r.input(x).placements().str();
    tp_rows[size_t(rank)] = r.input(x, parallel::DimLayout{{{"tp", Shard(0)}}}).placements().str();
    bad_layout[size_t(rank)] = error_of([&] { r.input(x, parallel::DimLayout{{{"ep", Shard(0)}}}); });
  });
  for (int rank = 0; rank < 4; ++rank) {
    INFO("rank " << rank);
    CHECK(allclose(outs[size_t(rank)], expected, 1e-5, 1e-6));
    CHECK(contains(described[size_t(rank)], "mesh (dp=2, tp=2) (local backend), plan mlp-tp, ZeRO-2 over dp=2"));
    CHECK(default_layout[size_t(rank)] == "[S(0), R]");  // the plan's data layout: rows over dp
    CHECK(tp_rows[size_t(rank)] == "[R, S(0)]");
    CHECK(contains(bad_layout[size_t(rank)], "names dim 'ep' that mesh (dp=2, tp=2) lacks"));
  }
  CHECK(bitwise_equal(run.input(x), x));  // one device: the tensor itself
}

TEST_CASE("run: the forward context keys dropout by step between steps, and is restored after", "[run]") {
  const nn::ForwardContext before = nn::forward_context();
  {
    auto model = nn::make_model<MlpClassifier>(MlpConfig{});
    model->reset_parameters(1);
    RunOptions o;
    o.seed = 11;
    auto run = parallelize(model, adamw(), o);
    CHECK(nn::forward_context().seed == 11);
    CHECK(nn::forward_context().step == 0);
    auto [x, y] = mlp_batch(MlpConfig{}, kBatch, 0, 0);
    run.model().loss(x, y).backward();
    run.step_optimizer();
    CHECK(nn::forward_context().step == 1);
    const nn::ForwardContext mb = run.forward_context(4, 8);
    CHECK((mb.seed == 11 && mb.step == 1 && mb.batch_offset == 4 && mb.global_batch == 8));
  }
  CHECK(nn::forward_context().seed == before.seed);
  CHECK(nn::forward_context().step == before.step);
}

// Context parallelism through tessel::Run: LLaMA on cp=2 in bitwise mode with
// micro-batches of one sequence keeps every attention call on the rank's own
// queries (none gathered) and gives the one-device loss bits; with two
// sequences per micro-batch the weight gradients gather time (a warning, the
// same bits).
TEST_CASE("run: context parallel (cp=2) attention stays local for one sequence per micro-batch, bitwise", "[run][cp]") {
  auto losses = [](const MeshPtr& mesh, int64_t batch, ContextParallelAttentionCount* count) {
    numerics::BitwiseGuard bitwise(true);
    std::shared_ptr<models::LanguageModel> model = models::build_model(models::model_config("llama", "tiny"));
    model->reset_parameters(1);
    const ContextParallelAttentionCount before = context_parallel_attention_count();
    auto run = parallelize(model, mesh, parallel::builtin_plan("llama"), adamw({1e-2}), {});
    std::vector<double> out;
    for (int step = 0; step < 3; ++step) {
      Tensor ids = randint({batch, 33}, uint64_t(step + 5), 0, 200);
      out.push_back(run.forward_backward(ids.narrow(1, 0, 32), ids.narrow(1, 1, 32)).loss);
      run.step_optimizer();
    }
    const ContextParallelAttentionCount after = context_parallel_attention_count();
    if (count)
      *count = {after.local - before.local, after.gathered - before.gathered, after.whole - before.whole,
                after.balanced - before.balanced};
    return out;
  };
  for (int64_t batch : {1, 2}) {
    INFO("batch " << batch);
    const std::vector<double> ref = losses(nullptr, batch, nullptr);
    auto reports = on_ranks(2, [&](int) -> std::string {
      ContextParallelAttentionCount c;
      const std::vector<double> got = losses(Mesh::world({{"cp", 2}}), batch, &c);
      if (got != ref) return "losses differ from one device";
      if (batch == 1 && (c.local != 6 || c.balanced != 6 || c.gathered != 0 || c.whole != 0))
        return fmt::format("attention calls: {} local ({} balanced), {} gathered, {} whole (expected 6 balanced)",
                           c.local, c.balanced, c.gathered, c.whole);
      if (batch == 2 && (c.local != 0 || c.whole != 6))
        return fmt::format("attention calls: {} local, {} whole (expected 6 whole)", c.local, c.whole);
      return "";
    });
    CHECK(first_failure(reports) == "");
  }
}

// The same with attention dropout inside micro-batches (each micro-batch's
// probabilities sit at its rows of the step's: a dropout block), NanoGPT.
TEST_CASE("run: context parallel (cp=2) balanced attention with dropout in micro-batches, bitwise", "[run][cp]") {
  auto losses = [](const MeshPtr& mesh, ContextParallelAttentionCount* count) {
    numerics::BitwiseGuard bitwise(true);
    models::ModelConfig mc = models::model_config("nanogpt", "tiny");
    mc.dropout = 0.1;
    std::shared_ptr<models::LanguageModel> model = models::build_model(mc);
    model->reset_parameters(1);
    const ContextParallelAttentionCount before = context_parallel_attention_count();
    RunOptions o;
    o.micro_batches = 2;
    auto run = parallelize(model, mesh, parallel::builtin_plan("nanogpt"), adamw({1e-2}), o);
    std::vector<double> out;
    for (int step = 0; step < 3; ++step) {
      Tensor ids = randint({2, 33}, uint64_t(step + 5), 0, 200);
      out.push_back(run.forward_backward(ids.narrow(1, 0, 32), ids.narrow(1, 1, 32)).loss);
      out.push_back(double(run.step_optimizer().grad_norm));
    }
    const ContextParallelAttentionCount after = context_parallel_attention_count();
    if (count) count->balanced = after.balanced - before.balanced;
    return out;
  };
  const std::vector<double> ref = losses(nullptr, nullptr);
  auto reports = on_ranks(2, [&](int) -> std::string {
    ContextParallelAttentionCount c;
    if (losses(Mesh::world({{"cp", 2}}), &c) != ref) return "losses or grad norms differ from one device";
    if (c.balanced != 12) return fmt::format("{} balanced attention calls, expected 12", c.balanced);
    return "";
  });
  CHECK(first_failure(reports) == "");
}
