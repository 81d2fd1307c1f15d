// Compile mode (RunOptions::compile, runtime/capture.h, docs/compile.md):
// steps replayed from a recording give the eager run's bits -- losses,
// gradient norms, parameters -- in fast and bitwise mode, with dropout; a
// step that cannot be recorded faithfully runs eagerly (never a wrong
// answer); new shapes record again. Mixed mode (compiled modules, the rest
// eager) at the end.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "models/language_model.h"
#include "runtime/capture.h"
#include "runtime/profile.h"
#include "tessel.h"
#include "test/util/dist.h"
#include "test/util/error_of.h"
#include "test/skip.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

constexpr uint64_t kSeed = 11;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// Each rank's error message (assertions stay on the test's thread).
std::vector<std::string> errors_on_ranks(int n, const std::function<void(int)>& fn) {
  std::vector<std::string> out(size_t(n), "(no error)");
  comm::run_local(n, [&](int rank) { out[size_t(rank)] = error_of([&] { fn(rank); }); });
  return out;
}

uint64_t bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

struct Result {
  std::vector<uint64_t> loss, grad_norm;  // bits, per step
  std::string param_hash;
  CompileStats stats;
  std::vector<double> loss_scale;  // per step (loss scaling)
  int64_t skipped = 0;             // steps loss scaling skipped
};

struct Spec {
  std::string arch = "nanogpt";
  bool compile = false;
  double dropout = 0.1;
  int64_t steps = 20;
  int64_t micro_batches = 1;
  int64_t batch = 4, seq = 32;
  // The sequence length from this step on (a new shape mid-run); 0: never.
  int64_t change_seq_at = 0, changed_seq = 16;
  RunLossFn loss;  // null: the model's
  std::optional<nn::GradScalerOptions> loss_scaling;
  // Called before each step (0-based): host changes between steps.
  std::function<void(RunBase&, int64_t step)> before_step;
  nn::CompileModules modules = nn::CompileModules::None;  // mixed mode
  DType compute = DType::Float32;
  int zero = 0;
  nn::Recompute recompute = nn::Recompute::None;
};

// `mesh` (inside comm::run_local): the model laid out by its built-in plan,
// with sequence parallelism when the mesh has tp.
Result train(const Spec& spec, const MeshPtr& mesh = nullptr) {
  models::ModelConfig cfg = models::model_config(spec.arch, "tiny");
  cfg.dropout = spec.dropout;
  auto model = models::make_language_model(cfg, kSeed);
  RunOptions o;
  o.seed = kSeed;
  o.clip = 1.0;
  o.micro_batches = spec.micro_batches;
  o.compile = spec.compile;
  o.loss_scaling = spec.loss_scaling;
  o.compile_modules = spec.modules;
  o.compute = spec.compute;
  o.zero = spec.zero;
  o.recompute = spec.recompute;
  bool tp = false;
  for (int d = 0; mesh && d < mesh->ndim(); ++d) tp = tp || mesh->name(d) == "tp";
  auto run = parallelize(model, mesh, mesh ? parallel::builtin_plan(spec.arch, tp) : parallel::ParallelPlan{},
                         adamw({1e-3}), o, spec.loss);
  Result r;
  for (int64_t step = 0; step < spec.steps; ++step) {
    const int64_t t = spec.change_seq_at > 0 && step >= spec.change_seq_at ? spec.changed_seq : spec.seq;
    Tensor tokens = randint({spec.batch, t + 1}, kSeed * 1000 + uint64_t(step), 0, cfg.vocab_size);
    Tensor x = tokens.narrow(1, 0, t).contiguous(), y = tokens.narrow(1, 1, t).contiguous();
    if (spec.before_step) spec.before_step(run, step);
    r.loss.push_back(bits(run.forward_backward(x, y).loss_sum));
    const StepReport report = run.step_optimizer();
    r.grad_norm.push_back(bits(report.grad_norm));
    r.loss_scale.push_back(report.loss_scale);
    r.skipped += report.skipped;
  }
  r.param_hash = run.param_hash();
  r.stats = run.compile_stats();
  return r;
}

void check_same(const Result& eager, const Result& compiled) {
  REQUIRE(eager.loss.size() == compiled.loss.size());
  for (size_t i = 0; i < eager.loss.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(eager.loss[i] == compiled.loss[i]);
    CHECK(eager.grad_norm[i] == compiled.grad_norm[i]);
    CHECK(eager.loss_scale[i] == compiled.loss_scale[i]);
  }
  CHECK(eager.param_hash == compiled.param_hash);
}

// Trains `spec` eagerly, then with `compile` applied to it (compile mode or
// compiled modules); checks that every step's bits agree and returns the
// compiled run.
Result compiled_matches_eager(Spec spec, const std::function<void(Spec&)>& compile) {
  const Result eager = train(spec);
  compile(spec);
  const Result compiled = train(spec);
  check_same(eager, compiled);
  return compiled;
}

// ---- mixed mode (nn/compiled_module.h) ----------------------------------------------------------------------

// A small model of a user's own, with a module to compile.
struct TwoLayer : nn::UnaryModule {
  std::shared_ptr<nn::Linear> a, b;
  TwoLayer() : UnaryModule("TwoLayer") {
    a = child("a", std::make_shared<nn::Linear>(8, 16));
    b = child("b", std::make_shared<nn::Linear>(16, 8));
  }
  Tensor forward(const Tensor& x) override { return (*b)(gelu((*a)(x))) + x; }
};

// A module whose forward reads a value it computed on the host.
struct HostBranch : nn::UnaryModule {
  std::shared_ptr<nn::Linear> a;
  HostBranch() : UnaryModule("HostBranch") { a = child("a", std::make_shared<nn::Linear>(8, 8)); }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*a)(x);
    return sum(h).item<float>() > 0 ? h * Scalar(2.0) : h;  // data-dependent control flow
  }
};

// Trains `net` by hand (no Run): forward, backward, SGD; the parameters' and
// the input's gradient bits per step.
std::vector<std::vector<uint64_t>> hand_loop(nn::UnaryModule& net, int steps, int calls_per_step = 1) {
  std::vector<std::vector<uint64_t>> out;
  for (int s = 0; s < steps; ++s) {
    Tensor x = randn({6, 8}, PhiloxKey{kSeed, uint64_t(s)}).requires_grad_(true);
    Tensor h = x;
    for (int c = 0; c < calls_per_step; ++c) h = net(h);
    Tensor loss = sum(h * h);
    loss.backward();
    std::vector<uint64_t> step_bits{bits(double(loss.item<float>()))};
    for (float v : x.grad().to_vector<float>()) {
      uint32_t b;
      std::memcpy(&b, &v, 4);
      step_bits.push_back(b);
    }
    {
      NoGradGuard no_grad;
      for (Tensor& p : net.parameters()) {
        for (float v : p.grad().to_vector<float>()) {
          uint32_t b;
          std::memcpy(&b, &v, 4);
          step_bits.push_back(b);
        }
        p.sub_(p.grad() * Scalar(0.01));
        p.zero_grad();
      }
    }
    out.push_back(step_bits);
  }
  return out;
}

}  // namespace

TEST_CASE("compile: replayed steps give the eager run's bits (NanoGPT, LLaMA; fast and bitwise; dropout)", "[compile]") {
  for (const std::string arch : {"nanogpt", "llama"}) {
    for (const bool bitwise : {false, true}) {
      INFO(arch << (bitwise ? " bitwise" : " fast"));
      numerics::BitwiseGuard mode(bitwise);
      Spec spec;
      spec.arch = arch;
      const Result eager = train(spec);
      spec.compile = true;
      const Result compiled = train(spec);
      check_same(eager, compiled);
      INFO(compiled.stats.refused);
      CHECK(compiled.stats.refused.empty());
      CHECK(compiled.stats.captures == 2);
      CHECK(compiled.stats.replays == spec.steps - 3);
      CHECK(compiled.stats.eager_steps == 3);
      CHECK(compiled.stats.launches > 50);  // the forward and backward kernels of 2 blocks
      CHECK(!eager.stats.enabled);
    }
  }
}

// Fusion (runtime/capture_fusion.cc) on a mesh: each rank fuses the chains of
// its own pieces (SwiGLU's, on tp's shard of the hidden features) and still
// gives the one-device bits.
TEST_CASE("compile with fused chains on dp=2 x tp=2 + sp: the one-device bits (LLaMA)", "[compile][comm][fusion]") {
  numerics::BitwiseGuard bitwise(true);
  Spec spec;
  spec.arch = "llama";
  spec.steps = 6;
  spec.batch = 16;
  spec.seq = 64;  // a rank's SwiGLU chains span more than one tile
  const Result one = train(spec);
  spec.compile = true;
  std::vector<Result> ranks(4);
  comm::run_local(4, [&](int rank) { ranks[size_t(rank)] = train(spec, Mesh::world({{"dp", 2}, {"tp", 2}})); });
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r << ": " << ranks[size_t(r)].stats.refused);
    check_same(one, ranks[size_t(r)]);
    CHECK(ranks[size_t(r)].stats.replays == spec.steps - 3);
    CHECK(ranks[size_t(r)].stats.fused_chains >= 4);  // SwiGLU's forward and backward, per block
  }
}

// The scale is an argument of the recorded loss multiplication: a replay at
// another scale would scale by the old one and unscale by the new one. A
// scale that grows (every 4 clean steps here) or backs off (after steps whose
// scaled loss overflows: an initial scale of 1e38) records again.
TEST_CASE("compile: loss scaling replays with the eager bits; a new scale records again", "[compile]") {
  for (const double init_scale : {1024.0, 1e38}) {
    INFO("initial scale " << init_scale);
    Spec spec;
    nn::GradScalerOptions g;
    g.init_scale = init_scale;
    g.growth_interval = 4;
    spec.loss_scaling = g;
    const Result eager = train(spec);
    spec.compile = true;
    const Result compiled = train(spec);
    check_same(eager, compiled);
    INFO(compiled.stats.refused);
    CHECK(compiled.stats.refused.empty());
    CHECK(compiled.stats.replays > 0);
    CHECK(compiled.stats.recaptures > 0);
    CHECK(eager.loss_scale.front() != eager.loss_scale.back());  // the scale did change
    if (init_scale > 1e30) CHECK(eager.skipped > 0);              // and steps were skipped
  }
}

TEST_CASE("compile: micro-batches (gradient accumulation) replay with the eager bits", "[compile]") {
  Spec spec;
  spec.micro_batches = 2;
  spec.steps = 8;
  const Result compiled = compiled_matches_eager(spec, [](Spec& s) { s.compile = true; });
  CHECK(compiled.stats.replays == 5);
}

TEST_CASE("compile: a new sequence length records again; the bits stay the eager run's", "[compile]") {
  Spec spec;
  spec.steps = 12;
  spec.change_seq_at = 6;
  const Result compiled = compiled_matches_eager(spec, [](Spec& s) { s.compile = true; });
  CHECK(compiled.stats.refused.empty());
  CHECK(compiled.stats.recaptures == 1);
  CHECK(compiled.stats.captures == 4);
  CHECK(compiled.stats.replays == 12 - 3 - 2);
}

TEST_CASE("compile: eval(), frozen parameters and record_again() between steps record again, never a stale replay",
          "[compile]") {
  SECTION("eval() then train(): dropout off and on again") {
    Spec spec;
    spec.steps = 14;
    spec.before_step = [](RunBase& run, int64_t step) {
      if (step == 7) run.module().eval();
      if (step == 10) run.module().train();
    };
    const Result eager = train(spec);
    spec.compile = true;
    const Result compiled = train(spec);
    check_same(eager, compiled);
    CHECK(compiled.stats.refused.empty());
    CHECK(compiled.stats.recaptures == 2);
    CHECK(compiled.stats.replays == 14 - 3 - 2 - 2);
  }
  SECTION("a parameter frozen mid-run gets no more gradient") {
    Spec spec;
    spec.steps = 10;
    spec.before_step = [](RunBase& run, int64_t step) {
      if (step == 6)
        for (auto& [path, p] : run.module().named_parameters())
          if (path.find("wte") != std::string::npos) p.requires_grad_(false);
    };
    const Result eager = train(spec);
    spec.compile = true;
    const Result compiled = train(spec);
    check_same(eager, compiled);
    CHECK(compiled.stats.recaptures == 1);
  }
  SECTION("host state of the loss's own, announced with record_again()") {
    auto doubled = std::make_shared<bool>(false);
    Spec spec;
    spec.steps = 10;
    spec.loss = [doubled](nn::Module& m, const Tensor& x, const Tensor& y) {
      auto& lm = static_cast<models::LanguageModel&>(m);
      Tensor loss = lm.token_loss(lm.forward(x), y);
      return *doubled ? loss * Scalar(2.0) : loss;
    };
    spec.before_step = [doubled](RunBase& run, int64_t step) {
      if (step == 6) {
        *doubled = true;
        run.record_again();
      }
    };
    const Result eager = train(spec);
    *doubled = false;
    spec.compile = true;
    const Result compiled = train(spec);
    check_same(eager, compiled);
    CHECK(compiled.stats.recaptures == 1);
    CHECK(compiled.stats.replays == 10 - 3 - 2);
  }
}

TEST_CASE("compile: a step that reads a computed value on the host runs eagerly, with the reason", "[compile][errors]") {
  Spec spec;
  spec.steps = 6;
  // A branch on a value the step computed: a replay could not redo it.
  spec.loss = [](nn::Module& m, const Tensor& x, const Tensor& y) {
    auto& lm = static_cast<models::LanguageModel&>(m);
    Tensor loss = lm.token_loss(lm.forward(x), y);
    return loss.item<double>() > 1e6 ? loss * Scalar(0.5) : loss;
  };
  const Result compiled = compiled_matches_eager(spec, [](Spec& s) { s.compile = true; });
  INFO(compiled.stats.refused);
  CHECK(contains(compiled.stats.refused, "the host read the values of Tensor(float32, cpu, shape=[])"));
  CHECK(contains(compiled.stats.refused, "at step 2"));
  CHECK(compiled.stats.replays == 0);
  CHECK(compiled.stats.eager_steps == 6);
}

TEST_CASE("compile: a tensor built on the host from the data is caught by comparing two recordings", "[compile][errors]") {
  Spec spec;
  spec.steps = 6;
  // Per-token weights made on the host from the targets: new values every
  // step, which a replay of the recorded constant would silently reuse.
  spec.loss = [](nn::Module& m, const Tensor& x, const Tensor& y) {
    auto& lm = static_cast<models::LanguageModel&>(m);
    Tensor logits = lm.forward(x);
    std::vector<float> w(size_t(y.numel()));
    {
      capture::Recorder::Unrecorded host(capture::active());  // reading the inputs is not the point here
      const int64_t* t = y.contiguous().data<int64_t>();
      for (size_t i = 0; i < w.size(); ++i) w[i] = t[i] % 2 == 0 ? 1.0f : 0.5f;
    }
    Tensor weights = tensor(w, y.shape());
    return lm.token_loss(logits, y) * mean(weights);
  };
  const Result compiled = compiled_matches_eager(spec, [](Spec& s) { s.compile = true; });
  INFO(compiled.stats.refused);
  CHECK(contains(compiled.stats.refused, "steps 2 and 3 recorded differently"));
  CHECK(contains(compiled.stats.refused, "filled on the host with other values"));
  CHECK(compiled.stats.replays == 0);
}

TEST_CASE("compile: what this version does not record is refused at parallelize, naming it", "[compile][errors]") {
  auto model = models::make_language_model(models::model_config("nanogpt", "tiny"), kSeed);
  for (const std::string& e : errors_on_ranks(2, [](int rank) {
         auto m = models::make_language_model(models::model_config("nanogpt", "tiny"), kSeed);
         RunOptions o;
         o.compile = rank == 0;
         parallelize(m, Mesh::world({{"dp", 2}}), parallel::ParallelPlan{}, adamw(), o);
       })) {
    INFO(e);
    CHECK(contains(e, "but not on every rank of mesh"));
  }
  for (const std::string& e : errors_on_ranks(2, [](int rank) {
         auto m = models::make_language_model(models::model_config("nanogpt", "tiny"), kSeed);
         RunOptions o;
         o.compile_modules = rank == 0 ? nn::CompileModules::Blocks : nn::CompileModules::None;
         parallelize(m, Mesh::world({{"dp", 2}}), parallel::ParallelPlan{}, adamw(), o);
       })) {
    INFO(e);
    CHECK(contains(e, "RunOptions::compile_modules is"));
    CHECK(contains(e, "but not on every rank of mesh"));
  }
  RunOptions o;
  o.compile = true;
  o.detect_anomaly = true;
  const std::string e = error_of([&] { parallelize(model, adamw(), o); });
  CHECK(contains(e, "RunOptions::compile with anomaly detection"));
}

// MoE routing is host work: compile splits the step around it, compiling
// the attention layers (mixed mode), with the eager bits.
TEST_CASE("compile: a model with MoE layers compiles its attention layers, the eager bits", "[compile]") {
  Spec spec;
  spec.arch = "mixtral";
  spec.steps = 8;
  const Result compiled = compiled_matches_eager(spec, [](Spec& s) { s.compile = true; });
  CHECK(!compiled.stats.enabled);  // not the whole step
  CHECK(compiled.stats.modules.modules == 2);
  CHECK(compiled.stats.modules.replayed == 2 * (8 - 3));
  CHECK(compiled.stats.modules.refused.empty());
}

// ---- the recorder itself -------------------------------------------------------------------------------------------

TEST_CASE("capture: collectives are recorded and replayed, an async one with its wait", "[compile][comm]") {
  // Each rank records y = x * 2, an asynchronous all-reduce of y and its
  // wait; a replay with new x gives the new sum.
  std::vector<std::vector<float>> replayed(2);

  comm::run_local(2, [&](int rank) {
    Tensor x = tensor(std::vector<float>{1.0f + float(rank), 2.0f}, Dims{2});
    std::unique_ptr<capture::Program> p;
    Tensor y;
    int out = -1;
    {
      capture::Recorder rec("all-reduce test");
      rec.input(x);
      y = x * Scalar(2.0);
      comm::world()->all_reduce(y, comm::ReduceOp::Sum, /*async=*/true)->wait();
      out = rec.output(y);
      p = rec.finish();
    }
    Tensor next = tensor(std::vector<float>{10.0f * float(rank + 1), 1.0f}, Dims{2});
    p->set_input(0, next);
    p->replay();
    replayed[size_t(rank)] = p->output(out, y).to_vector<float>();
  });
  for (int r = 0; r < 2; ++r) CHECK(replayed[size_t(r)] == std::vector<float>{60.0f, 4.0f});  // 2 * (10 + 20), 2 * (1 + 1)
}

TEST_CASE("capture: an async collective waited for after the recording refuses it", "[compile][comm][errors]") {
  std::vector<std::string> errors = errors_on_ranks(2, [](int) {
    Tensor x = tensor(std::vector<float>{1.0f, 2.0f}, Dims{2});
    comm::WorkPtr w;
    std::string e;
    {
      capture::Recorder rec("late wait");
      Tensor y = x * Scalar(2.0);
      w = comm::world()->all_reduce(y, comm::ReduceOp::Sum, /*async=*/true);
      e = error_of([&] { rec.finish(); });
    }
    w->wait();
    throw Error(e);
  });
  for (const std::string& e : errors) {
    INFO(e);
    CHECK(contains(e, "1 asynchronous collective(s) started in the step (the first: all_reduce) were waited for after it"));
  }
}

// `--profile` / `bench step --compile`: a profiled replay is a row per
// kernel, so a compiled step's profile says where its time goes.
TEST_CASE("capture: a profiled replay times each launch under its kernel's name", "[compile]") {
  Tensor x = tensor(std::vector<float>{1.0f, 2.0f}, Dims{2});
  std::unique_ptr<capture::Program> p;
  {
    capture::Recorder rec("profiled");
    rec.input(x);
    Tensor y = exp(x * Scalar(3.0)) + x;
    rec.output(y);
    p = rec.finish();
  }
  REQUIRE(p->launches() >= 3);  // mul, exp, add
  profile::Profiler prof;
  {
    profile::Scope scope(&prof);
    p->replay();
  }
  int64_t calls = 0;
  bool saw_unary = false;
  for (const profile::Row& r : prof.rows()) {
    INFO(r.name);
    CHECK(!r.name.empty());
    CHECK(r.self_s >= 0);
    saw_unary = saw_unary || r.name == "unary";
    calls += r.calls;
  }
  CHECK(saw_unary);  // exp's kernel
  CHECK(calls == p->launches());
  profile::Profiler off;  // not installed: the replay adds nothing to it
  p->replay();
  CHECK(off.rows().empty());
}

TEST_CASE("capture: a checked read that sees other values at replay throws ReplayDiverged", "[compile][errors]") {
  Tensor flag = tensor(std::vector<float>{1.0f}, Dims{1});  // from before the step
  Tensor x = tensor(std::vector<float>{1.0f, 2.0f}, Dims{2});
  std::unique_ptr<capture::Program> p;
  {
    capture::Recorder rec("checked read");
    Tensor y = x * Scalar(3.0);
    rec.output(y);
    rec.checked_read(flag);
    CHECK(flag.data<float>()[0] == 1.0f);  // allowed: checked at every replay
    p = rec.finish();
  }
  p->replay();  // the same value: fine
  flag.data<float>()[0] = 0.0f;
  const std::string e = error_of([&] { p->replay(); });
  CHECK(contains(e, "the replayed step read other values of Tensor(float32, cpu, shape=[1])"));
  CHECK_THROWS_AS(p->replay(), capture::ReplayDiverged);
}

// FSDP frees a unit's gathered parameters after use and refills the same
// storage object before the next (StorageImpl::release / reallocate): host
// work the kernels depend on, recorded as launches and done again in order.
// Between replays the step's temporaries are dead: when the outputs can
// have an arena of their own at no cost (none of them could take bytes a
// temporary left), the temporaries' arena gives its memory back after each
// replay and gets it again at the next; when they cannot, one arena stays.
TEST_CASE("capture: the temporaries' arena is given back between replays; the outputs' stays", "[compile]") {
  const int64_t n = 1024;  // 4 KiB per tensor
  Tensor x = randn({n}, PhiloxKey{kSeed, 1});
  auto record = [&](const std::function<Tensor(const Tensor&)>& fn, std::unique_ptr<capture::Program>& p, Tensor& y) {
    NoGradGuard no_grad;
    Tensor in = x.clone();  // the program's own input buffer (made before the recording)
    capture::Recorder rec("arenas");
    rec.input(in);
    y = fn(in);
    const int out = rec.output(y);
    p = rec.finish();
    return out;
  };
  // a and b are read by the add that makes y: y cannot take their bytes.
  // (No scalar operands: their fills would be temporaries too.)
  auto apart = [](const Tensor& in) {
    Tensor a = in * in, b = exp(in);
    return a + b;
  };
  std::unique_ptr<capture::Program> p;
  Tensor y;
  const int out = record(apart, p, y);
  const Tensor eager = y.clone();
  Allocator* alloc = cpu_allocator();
  p->set_input(0, x);
  p->replay();
  CHECK(bitwise_equal(p->output(out, y), eager));
  CHECK(p->held_bytes() <= p->bytes() - 2 * n * 4);  // (the temporaries: at least a and b)
  const int64_t between = alloc->stats().current_bytes;
  p->set_input(0, x * Scalar(3.0));
  p->replay();  // the arena comes back, the buffers follow it
  CHECK(bitwise_equal(p->output(out, y), apart(x * Scalar(3.0))));
  CHECK(alloc->stats().current_bytes == between);  // and is given back again

  // A chain: y takes the bytes of the first product, dead before it.
  auto chain = [](const Tensor& in) { return exp(in * Scalar(0.001)) * Scalar(3.0) + Scalar(1.0); };
  const int out2 = record(chain, p, y);
  p->set_input(0, x);
  p->replay();
  CHECK(bitwise_equal(p->output(out2, y), chain(x)));
  CHECK(p->held_bytes() == p->bytes());  // one arena, kept
  // Once its outputs are used and dropped, release_unheld gives that arena
  // back too (tessel::Run does after step_optimizer); a view of it still
  // held keeps it, with its values.
  {
    const Tensor kept = p->output(out2, y);
    CHECK(!p->release_unheld());
    CHECK(p->held_bytes() == p->bytes());
    CHECK(bitwise_equal(kept, chain(x)));
  }
  CHECK(p->release_unheld());
  CHECK(p->held_bytes() == n * 4);  // the input buffer alone
  p->set_input(0, x * Scalar(2.0));
  p->replay();  // allocated again, the buffers re-pointed
  CHECK(bitwise_equal(p->output(out2, y), chain(x * Scalar(2.0))));
  // An output kept past the next replay keeps its values (the replay writes
  // new memory), and outlives the program.
  const Tensor kept = p->output(out2, y);
  p->set_input(0, x * Scalar(5.0));
  p->replay();
  CHECK(bitwise_equal(kept, chain(x * Scalar(2.0))));
  CHECK(bitwise_equal(p->output(out2, y), chain(x * Scalar(5.0))));
  p.reset();
  CHECK(bitwise_equal(kept, chain(x * Scalar(2.0))));
}

TEST_CASE("capture: bind_input reads the caller's tensor; set_input never writes one", "[compile]") {
  const int64_t n = 4096;  // 16 KiB
  Tensor recorded = randn({n}, PhiloxKey{kSeed, 3});
  std::unique_ptr<capture::Program> p;
  Tensor y;
  int out = -1;
  {
    NoGradGuard no_grad;
    capture::Recorder rec("bind");
    rec.input(recorded);  // the caller's tensor itself, as tessel::Run records a whole batch
    recorded.add_(Scalar(1.0));  // the step writes its input, in place
    y = recorded * Scalar(2.0);
    out = rec.output(y);
    p = rec.finish();
  }
  const Tensor kept = recorded.clone();
  // set_input while the caller still holds the recorded tensor: the copy
  // goes to memory of the program's own, not into the caller's tensor.
  Tensor a = randn({n}, PhiloxKey{kSeed, 4});
  const Tensor a0 = a.clone();
  p->set_input(0, a);
  p->replay();
  CHECK(bitwise_equal(p->output(out, y), (a0 + Scalar(1.0)) * Scalar(2.0)));
  CHECK(bitwise_equal(recorded, kept));
  CHECK(bitwise_equal(a, a0));  // a copy was written, not a
  // bind_input: the replay reads b where it is and writes it in place, as eager would.
  Tensor b = randn({n}, PhiloxKey{kSeed, 5});
  const Tensor b0 = b.clone();
  const int64_t own = p->bytes();
  p->bind_input(0, b);
  CHECK(p->bytes() == own - n * 4);  // the caller's memory, not the program's
  p->replay();
  CHECK(bitwise_equal(b, b0 + Scalar(1.0)));
  CHECK(bitwise_equal(p->output(out, y), (b0 + Scalar(1.0)) * Scalar(2.0)));
  // Another tensor bound; then set_input again: b is not written.
  Tensor c = randn({n}, PhiloxKey{kSeed, 6});
  const Tensor c0 = c.clone();
  p->bind_input(0, c);
  p->replay();
  CHECK(bitwise_equal(p->output(out, y), (c0 + Scalar(1.0)) * Scalar(2.0)));
  const Tensor b1 = b.clone(), c1 = c.clone();
  p->set_input(0, a0);
  CHECK(p->bytes() == own);
  p->replay();
  CHECK(bitwise_equal(p->output(out, y), (a0 + Scalar(1.0)) * Scalar(2.0)));
  CHECK(bitwise_equal(b, b1));
  CHECK(bitwise_equal(c, c1));
  // A tensor of another size is an error naming both.
  CHECK_THROWS_WITH(p->bind_input(0, randn({n / 2}, PhiloxKey{kSeed, 7})),
                    Catch::Contains("input 0 is") && Catch::Contains("the recorded one held 16384 bytes"));
}

TEST_CASE("capture: a program in parts holds a part's temporaries only while it runs, and gives all back after",
          "[compile]") {
  // Mixed mode's shape: a forward part (outputs read after it), a backward
  // part with an input of its own. Per part: what it alone uses; across
  // them: what the backward reads of the forward.
  const int64_t n = 1024;  // 4 KiB per tensor
  const int64_t kb = n * 4;
  Tensor x = randn({n}, PhiloxKey{kSeed, 8}), g = randn({n}, PhiloxKey{kSeed, 9});
  auto forward = [](const Tensor& in, Tensor& kept) {
    Tensor t1 = exp(in), t2 = in * in;  // the forward's temporaries
    kept = t1 + t2;                     // read by the backward
    return kept * kept;                 // the output
  };
  auto backward = [](const Tensor& kept, const Tensor& grad) {
    Tensor u = kept * grad;  // the backward's temporary
    return u + grad;         // its output
  };
  std::unique_ptr<capture::Program> p;
  Tensor y, dx, kept;
  int oy = -1, odx = -1;
  int64_t part = 0;
  {
    NoGradGuard no_grad;
    Tensor xin = x.clone(), gin = g.clone();
    capture::Recorder rec("parts");
    rec.outputs_read_per_part = true;
    rec.input(xin);
    y = forward(xin, kept);
    oy = rec.output(y);
    part = rec.launches();
    rec.suspend();
    rec.resume();
    rec.input(gin);
    dx = backward(kept, gin);
    odx = rec.output(dx);
    kept = Tensor();
    p = rec.finish();
  }
  Tensor ekept;
  const Tensor ey = forward(x, ekept), edx = backward(ekept, g);
  auto held = [&] { return p->held_bytes(); };
  const int64_t inputs = 2 * kb;
  CHECK(held() == inputs);  // before any replay: the arenas are allocated by the replays that use them
  p->set_input(0, x);
  p->replay_range(0, part);
  CHECK(held() == inputs + 3 * kb);  // the forward's arena (t1 and t2; y takes t1's bytes) and kept's
  CHECK(bitwise_equal(p->output(oy, y), ey));
  p->release_finished(part);
  CHECK(held() == inputs + kb);  // kept alone, until the backward
  p->set_input(1, g);
  p->replay_range(part, p->launches());
  CHECK(bitwise_equal(p->output(odx, dx), edx));
  p->release_finished(p->launches());
  CHECK(held() == inputs);  // every arena back
  p->release_inputs();
  CHECK(held() == 0);  // and the inputs' copies
  CHECK_THROWS_WITH(p->replay_range(0, part), Catch::Contains("input 0 was given back (release_inputs) and not set "
                                                              "again (set_input)"));
  // Set again: the next call replays as the first did.
  p->set_input(0, x * Scalar(2.0));
  p->replay_range(0, part);
  Tensor k2;
  CHECK(bitwise_equal(p->output(oy, y), forward(x * Scalar(2.0), k2)));
  p->release_finished(part);
  p->set_input(1, g);
  p->replay_range(part, p->launches());
  CHECK(bitwise_equal(p->output(odx, dx), backward(k2, g)));
}

TEST_CASE("capture: an arena is cut into blocks the allocator serves without rounding", "[compile]") {
  if (!cpu_allocator_pools()) TESSEL_SKIP("TESSEL_CPU_ALLOCATOR=system: blocks are not rounded");
  // 21 outputs of 128 KiB, all alive to the end: 2688 KiB in one arena,
  // which the pooling allocator would serve from its 2816 KiB class. Cut
  // into a 2560 KiB block and a 128 KiB one, both classes: nothing rounded.
  const int64_t n = 32768;  // floats: 128 KiB
  const int64_t kOutputs = 21;
  Tensor x = randn({n}, PhiloxKey{kSeed, 2});
  std::unique_ptr<capture::Program> p;
  std::vector<Tensor> ys;
  std::vector<int> outs;
  {
    NoGradGuard no_grad;
    Tensor in = x.clone();
    capture::Recorder rec("cut arena");
    rec.input(in);
    for (int64_t k = 0; k < kOutputs; ++k) ys.push_back(in * Scalar(double(k + 1)));
    for (const Tensor& y : ys) outs.push_back(rec.output(y));
    p = rec.finish();
  }
  const int64_t whole = kOutputs * n * 4;
  REQUIRE(int64_t(cpu_size_class(size_t(whole))) > whole);  // one block would round up
  Allocator* alloc = cpu_allocator();
  ys.clear();  // the recording's eager outputs: the arena holds them from now on
  const Tensor like = zeros({n});  // (the outputs' layout)
  const int64_t before = alloc->stats().current_bytes;
  p->set_input(0, x);
  p->replay();
  CHECK(alloc->stats().current_bytes - before == whole);  // the outputs' blocks, exactly (the temporaries' went back)
  for (int64_t k = 0; k < kOutputs; ++k)
    CHECK(bitwise_equal(p->output(outs[size_t(k)], like), x * Scalar(double(k + 1))));
  p->set_input(0, x * Scalar(2.0));
  p->replay();
  for (int64_t k = 0; k < kOutputs; ++k)
    CHECK(bitwise_equal(p->output(outs[size_t(k)], like), x * Scalar(2.0) * Scalar(double(k + 1))));
}

TEST_CASE("capture: a storage released and refilled in place is released and refilled again at replay", "[compile]") {
  Tensor gathered = tensor(std::vector<float>{0.0f, 0.0f}, Dims{2});  // from before the step, released between steps
  gathered.storage()->release();
  Tensor x = tensor(std::vector<float>{1.0f, 2.0f}, Dims{2});
  std::unique_ptr<capture::Program> p;
  Tensor y;
  int out = -1;
  {
    capture::Recorder rec("release and refill");
    rec.input(x);
    gathered.storage()->reallocate();
    gathered.copy_(x * Scalar(2.0));  // the refill
    y = gathered + x;
    gathered.storage()->release();  // after its last use
    out = rec.output(y);
    p = rec.finish();
    CHECK(p->launches() >= 5);  // reallocate, mul, the copy, add, release
  }
  CHECK(y.to_vector<float>() == std::vector<float>{3.0f, 6.0f});
  CHECK(gathered.storage()->released());
  p->set_input(0, tensor(std::vector<float>{10.0f, 20.0f}, Dims{2}));
  p->replay();
  CHECK(p->output(out, y).to_vector<float>() == std::vector<float>{30.0f, 60.0f});
  CHECK(gathered.storage()->released());  // released again, as eager left it
  // A storage the step made itself is not released in place by any layer:
  // refused rather than replayed against the arena.
  capture::Recorder rec("own storage");
  Tensor z = x * Scalar(2.0);
  z.storage()->release();
  const std::string e = error_of([&] { rec.finish(); });
  CHECK(contains(e, "storage_release of a buffer of 8 bytes the step made itself"));
}

TEST_CASE("capture: a tensor made in an Unrecorded scope and used by a recorded launch refuses the recording",
          "[compile][errors]") {
  Tensor x = tensor(std::vector<float>{1.0f, 2.0f}, Dims{2});
  capture::Recorder rec("unrecorded");
  Tensor z;
  {
    capture::Recorder::Unrecorded skip(&rec);
    z = x * Scalar(2.0);  // not in the program
  }
  Tensor w = z + x;  // would read a buffer a replay never fills
  const std::string e = error_of([&] { rec.finish(); });
  CHECK(contains(e, "was made by work the recording skipped"));
}

TEST_CASE("compile on dp=2: a parameter frozen mid-run records again, same bits; the Run ends cleanly", "[compile][comm]") {
  // Each rank: eager and compiled DDP runs, wte frozen before step 7 (the
  // data-parallel reducer then has a parameter that stopped wanting
  // gradients, which its destructor must survive).
  std::vector<std::string> hashes(4), refused(2);
  std::vector<int64_t> recaptures(2, -1);
  comm::run_local(2, [&](int rank) {
    for (const bool compile : {false, true}) {
      auto model = models::make_language_model(models::model_config("nanogpt", "tiny"), kSeed);
      RunOptions o;
      o.seed = kSeed;
      o.compile = compile;
      auto run = parallelize(model, Mesh::world({{"dp", 2}}), parallel::ParallelPlan{}, adamw({1e-3}), o);
      for (int64_t step = 0; step < 10; ++step) {
        if (step == 6)
          for (auto& [path, p] : run.module().named_parameters())
            if (path.find("wte") != std::string::npos) p.requires_grad_(false);
        Tensor tokens = randint({4, 17}, kSeed * 1000 + uint64_t(step), 0, 256);
        run.forward_backward(tokens.narrow(1, 0, 16).contiguous(), tokens.narrow(1, 1, 16).contiguous());
        run.step_optimizer();
      }
      hashes[size_t(rank * 2 + (compile ? 1 : 0))] = run.param_hash();
      if (compile) {
        refused[size_t(rank)] = run.compile_stats().refused;
        recaptures[size_t(rank)] = run.compile_stats().recaptures;
      }
    }
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << refused[size_t(r)]);
    CHECK(hashes[size_t(2 * r)] == hashes[size_t(2 * r + 1)]);
    CHECK(refused[size_t(r)].empty());
    CHECK(recaptures[size_t(r)] == 1);
  }
}

// A global batch smaller than dp: rank 1 gets no rows, so its step makes
// empty tensors every time. They are the step's own (not tensors from before
// it that were "replaced"), so both ranks replay, with the eager bits.
TEST_CASE("compile on dp=2 with one sequence: the rank with no rows replays too", "[compile][comm]") {
  std::vector<std::string> hashes(4), refused(2);
  std::vector<int64_t> replays(2, -1);
  comm::run_local(2, [&](int rank) {
    for (const bool compile : {false, true}) {
      auto model = models::make_language_model(models::model_config("llama", "tiny"), kSeed);
      RunOptions o;
      o.seed = kSeed;
      o.compile = compile;
      auto run = parallelize(model, Mesh::world({{"dp", 2}}), parallel::ParallelPlan{}, adamw({1e-3}), o);
      for (int64_t step = 0; step < 8; ++step) {
        Tensor tokens = randint({1, 17}, kSeed * 1000 + uint64_t(step), 0, 256);
        run.forward_backward(tokens.narrow(1, 0, 16).contiguous(), tokens.narrow(1, 1, 16).contiguous());
        run.step_optimizer();
      }
      hashes[size_t(rank * 2 + (compile ? 1 : 0))] = run.param_hash();
      if (compile) {
        refused[size_t(rank)] = run.compile_stats().refused;
        replays[size_t(rank)] = run.compile_stats().replays;
      }
    }
  });
  for (int r = 0; r < 2; ++r) {
    INFO("rank " << r << ": " << refused[size_t(r)]);
    CHECK(hashes[size_t(2 * r)] == hashes[size_t(2 * r + 1)]);
    CHECK(refused[size_t(r)].empty());
    CHECK(replays[size_t(r)] == 5);
  }
}

// ---- mixed mode: compiled modules ----------------------------------------------------------------------------


TEST_CASE("compiled modules: blocks and attention layers replay with the eager bits (NanoGPT, LLaMA; fast and "
          "bitwise; dropout)",
          "[compile]") {
  for (const std::string arch : {"nanogpt", "llama"}) {
    for (const bool bitwise : {false, true}) {
      numerics::BitwiseGuard mode(bitwise);
      Spec spec;
      spec.arch = arch;
      spec.steps = 12;
      const Result eager = train(spec);
      CHECK(eager.stats.modules.modules == 0);
      for (const auto which : {nn::CompileModules::Blocks, nn::CompileModules::Attention}) {
        INFO(arch << (bitwise ? " bitwise " : " fast ") << nn::compile_modules_name(which));
        spec.modules = which;
        const Result compiled = train(spec);
        check_same(eager, compiled);
        const nn::ModuleCompileStats& m = compiled.stats.modules;
        INFO(m.refused);
        CHECK(m.refused.empty());
        CHECK(m.modules == 2);  // 2 layers
        CHECK(m.calls == 2 * spec.steps);
        CHECK(m.recordings == 2 * 2);
        CHECK(m.replayed == 2 * (spec.steps - 3));  // from each module's fourth call
        CHECK(m.launches > 20);
        CHECK(m.buffer_bytes > 0);
      }
    }
  }
}

TEST_CASE("compiled modules: micro-batches, bfloat16 autocast, a new sequence length; the eager bits", "[compile]") {
  Spec spec;
  spec.micro_batches = 2;
  spec.steps = 8;
  const Result compiled = compiled_matches_eager(spec, [](Spec& s) { s.modules = nn::CompileModules::Blocks; });
  CHECK(compiled.stats.modules.replayed == 2 * (2 * 8 - 3));  // every micro-batch's call counts

  Spec bf16;
  bf16.compute = DType::BFloat16;
  bf16.steps = 8;
  const Result compiled16 = compiled_matches_eager(bf16, [](Spec& s) { s.modules = nn::CompileModules::Blocks; });
  CHECK(compiled16.stats.modules.replayed == 2 * (8 - 3));

  Spec seq;
  seq.steps = 12;
  seq.change_seq_at = 6;
  const Result compiled_seq = compiled_matches_eager(seq, [](Spec& s) { s.modules = nn::CompileModules::Attention; });
  CHECK(compiled_seq.stats.modules.recaptures == 2);  // once per module
  CHECK(compiled_seq.stats.modules.recordings == 2 * 4);
  CHECK(compiled_seq.stats.modules.replayed == 2 * (12 - 3 - 2));
}

TEST_CASE("compiled modules: Mixtral's attention layers compile while its MoE layers run eagerly", "[compile]") {
  Spec spec;
  spec.arch = "mixtral";
  spec.steps = 8;
  const Result compiled = compiled_matches_eager(spec, [](Spec& s) { s.modules = nn::CompileModules::Attention; });
  CHECK(compiled.stats.modules.refused.empty());
  CHECK(compiled.stats.modules.replayed == 2 * (8 - 3));
}

// Each layout: the model trained on one device eagerly, then on its mesh
// (ranks as threads) with its modules compiled (or `compile`, which on an
// MoE model is mixed mode) and ZeRO stage `zero`, in bitwise mode with
// dropout and 2 micro-batches: every rank gets the one-device bits and
// replays every module call from the fourth.
struct MeshLayout {
  std::string arch;
  std::vector<Mesh::DimSpec> dims;
  nn::CompileModules modules;
  bool compile = false;
  int zero = 0;
};
void check_compiled_modules_on(const std::vector<MeshLayout>& layouts) {
  numerics::BitwiseGuard bitwise(true);
  for (const MeshLayout& l : layouts) {
    INFO(l.arch << (l.compile ? " compile " : " ") << nn::compile_modules_name(l.modules) << " zero " << l.zero);
    Spec spec;
    spec.arch = l.arch;
    spec.steps = 8;
    spec.micro_batches = 2;
    const Result one = train(spec);
    spec.modules = l.modules;
    spec.compile = l.compile;
    spec.zero = l.zero;
    int n = 1;
    for (const Mesh::DimSpec& d : l.dims) n *= int(d.size);
    std::vector<Result> ranks(static_cast<size_t>(n));
    comm::run_local(n, [&](int rank) { ranks[size_t(rank)] = train(spec, Mesh::world(l.dims)); });
    for (int r = 0; r < n; ++r) {
      INFO("rank " << r << ": " << ranks[size_t(r)].stats.modules.refused);
      check_same(one, ranks[size_t(r)]);
      CHECK(ranks[size_t(r)].stats.modules.refused.empty());
      CHECK(ranks[size_t(r)].stats.modules.modules == 2);
      CHECK(ranks[size_t(r)].stats.modules.replayed == 2 * (2 * 8 - 3));
    }
  }
}

TEST_CASE("compiled modules on dp=2 x tp=2 + sp and dp=2 x ep=2: the one-device bits", "[compile][comm]") {
  check_compiled_modules_on({{"nanogpt", {{"dp", 2}, {"tp", 2}}, nn::CompileModules::Blocks},
                             {"llama", {{"dp", 2}, {"tp", 2}}, nn::CompileModules::Attention},
                             {"mixtral", {{"dp", 2}, {"ep", 2}}, nn::CompileModules::Attention}});
}

// FSDP (zero = 3) gathers a unit's parameters in its module's forward
// hooks and releases them after; they run eagerly around a compiled
// module's recorded forward, so the recording reads the gathered copies and
// their gradients reach FSDP's gather node, as eagerly. NanoGPT's blocks are
// FSDP's units and the compiled modules at once; LLaMA's compiled attention
// sits inside a unit; Mixtral compiles (mixed mode) beside expert parallel.
TEST_CASE("compiled modules with FSDP (zero = 3) on dp=2, dp=2 x tp=2 + sp, dp=2 x ep=2: the one-device bits",
          "[compile][comm]") {
  check_compiled_modules_on({{"nanogpt", {{"dp", 2}}, nn::CompileModules::Blocks, false, 3},
                             {"llama", {{"dp", 2}, {"tp", 2}}, nn::CompileModules::Attention, false, 3},
                             {"mixtral", {{"dp", 2}, {"ep", 2}}, nn::CompileModules::None, true, 3}});
}

// Recomputation and compiled modules together: attention layers compiled
// inside blocks recomputed whole (the recomputation's call, in the
// backward, records and replays; the forward's, without gradients, runs
// eagerly), and blocks compiled around attention cores recomputed.
TEST_CASE("compiled modules with recomputation: the eager bits", "[compile]") {
  for (const bool full : {true, false}) {
    INFO((full ? "recompute full, attention compiled" : "recompute selective, blocks compiled"));
    Spec spec;
    spec.arch = "llama";
    spec.steps = 8;
    spec.recompute = full ? nn::Recompute::Full : nn::Recompute::Selective;
    const Result compiled = compiled_matches_eager(spec, [&](Spec& s) {
      s.modules = full ? nn::CompileModules::Attention : nn::CompileModules::Blocks;
    });
    INFO(compiled.stats.modules.refused);
    CHECK(compiled.stats.modules.refused.empty());
    CHECK(compiled.stats.modules.modules == 2);
    CHECK(compiled.stats.modules.replayed == 2 * (8 - 3));
  }
}

// A model whose module reads a value on the host on rank 0 only: rank 0's
// recording is refused, rank 1's is not. Both must run the module eagerly
// (a rank replaying while the other runs eagerly would reach the backward's
// collectives in another order), with the eager bits.
struct RankDependent : nn::UnaryModule {
  std::shared_ptr<nn::Linear> a;
  RankDependent() : UnaryModule("RankDependent") { a = child("a", std::make_shared<nn::Linear>(8, 8)); }
  Tensor forward(const Tensor& x) override {
    Tensor h = (*a)(x);
    if (comm::world()->rank() == 0) (void)raw::local_of(h).to_vector<float>();  // a host read, this rank only
    return h;
  }
};
struct RankDependentModel : nn::Module {
  std::shared_ptr<RankDependent> body;
  RankDependentModel() : nn::Module("RankDependentModel") { body = child("body", std::make_shared<RankDependent>()); }
  Tensor loss(const Tensor& x) { return sum((*body)(x) * (*body)(x)); }
};

// A model M with a `body` and loss(x), trained 6 steps on dp=2 (ranks as
// threads) with options `o`, eagerly and with its body compiled: per rank,
// the two param_hashes [2 * rank + compiled] and the compiled body's stats.
struct BodyOnDp2 {
  std::vector<std::string> hash = std::vector<std::string>(4);
  std::vector<nn::ModuleCompileStats> body = std::vector<nn::ModuleCompileStats>(2);
};
template <class M>
BodyOnDp2 body_compiled_on_dp2(const RunOptions& o = RunOptions{}) {
  BodyOnDp2 r;
  comm::run_local(2, [&](int rank) {
    for (const bool compiled : {false, true}) {
      auto model = nn::make_model<M>();
      model->reset_parameters(kSeed);
      auto run = parallelize(model, Mesh::world({{"dp", 2}}), parallel::builtin_plan("none"), adamw({0.1}), o);
      if (compiled) run.model().body->set_compiled(true);
      for (int64_t step = 0; step < 6; ++step) {
        Tensor x = randn({4, 8}, PhiloxKey{kSeed, uint64_t(step)});
        run.model().loss(run.input(x)).backward();
        run.step_optimizer();
      }
      r.hash[size_t(2 * rank + int(compiled))] = run.param_hash();
      if (compiled) r.body[size_t(rank)] = run.model().body->compile_stats();
    }
  });
  return r;
}

TEST_CASE("compiled modules on dp=2: a refusal on one rank makes every rank run the module eagerly", "[compile][comm]") {
  const BodyOnDp2 r = body_compiled_on_dp2<RankDependentModel>();
  CHECK(contains(r.body[0].refused, "the host read the values of"));
  CHECK(contains(r.body[1].refused, "another rank's recording of this module was refused"));
  CHECK(r.body[0].replayed == 0);
  CHECK(r.body[1].replayed == 0);
  CHECK(r.hash[0] == r.hash[1]);
  CHECK(r.hash[2] == r.hash[3]);
}

// Under FSDP a model whose forward hooks never run (its own loss(x), not
// operator()) has its parameters gathered on use: a compiled module inside
// sees the shards, and a replay would run no op that gathers them. It runs
// eagerly, with the reason, and the bits are the eager FSDP run's.
struct GatheredOnUse : nn::Module {
  std::shared_ptr<nn::Linear> body;
  GatheredOnUse() : nn::Module("GatheredOnUse") { body = child("body", std::make_shared<nn::Linear>(8, 8)); }
  Tensor loss(const Tensor& x) {
    Tensor h = (*body)(x);
    return sum(h * h);
  }
};

TEST_CASE("compiled modules with FSDP: parameters gathered on use run the module eagerly, with the reason",
          "[compile][comm][errors]") {
  RunOptions o;
  o.zero = 3;
  const BodyOnDp2 r = body_compiled_on_dp2<GatheredOnUse>(o);
  for (const nn::ModuleCompileStats& s : r.body) {
    INFO(s.refused);
    CHECK(contains(s.refused, "FSDP (ZeRO-3) shard gathered on use"));
  }
  CHECK(r.hash[0] == r.hash[1]);
  CHECK(r.hash[2] == r.hash[3]);
  CHECK(r.hash[0] == r.hash[2]);
}

TEST_CASE("compiled modules: a module of your own, in a loop of your own", "[compile]") {
  // One call per step, and two calls of the same module per step: the second
  // call finds the recording's buffers in use and runs eagerly.
  for (const int calls : {1, 2}) {
    INFO(calls << " call(s) per step");
    auto plain = std::make_shared<TwoLayer>();
    auto compiled = std::make_shared<TwoLayer>();
    plain->reset_parameters(kSeed);
    compiled->reset_parameters(kSeed);
    compiled->set_compiled(true);
    CHECK(hand_loop(*plain, 8, calls) == hand_loop(*compiled, 8, calls));
    const nn::ModuleCompileStats s = compiled->compile_stats();
    CHECK(s.refused.empty());
    CHECK(s.calls == 8 * calls);
    // Two calls: step 1 warms up and records its second call, step 2 records
    // its first; from step 3 the first call replays and the second finds the
    // buffers in use (as from step 2).
    CHECK(s.replayed == (calls == 1 ? 8 - 3 : 8 - 2));
    CHECK(s.busy == (calls == 1 ? 0 : 8 - 1));
    // Between steps a replayed module holds nothing: its arenas went back
    // after each part, its copies of the input and gradient after the backward.
    CHECK(s.buffer_bytes > 0);
    CHECK(s.held_bytes == 0);
    CHECK(plain->compile_stats().calls == 0);
  }
}

// Host state of the module's own (a scale it multiplies by) is an argument
// of a recorded kernel: after changing it, record_modules_again.
struct Scaled : nn::UnaryModule {
  std::shared_ptr<nn::Linear> a;
  double scale = 1.0;
  Scaled() : UnaryModule("Scaled") { a = child("a", std::make_shared<nn::Linear>(8, 8)); }
  Tensor forward(const Tensor& x) override { return (*a)(x) * Scalar(scale); }
};

TEST_CASE("compiled modules: record_modules_again after a change of the module's host state", "[compile]") {
  auto plain = std::make_shared<Scaled>();
  auto compiled = std::make_shared<Scaled>();
  plain->reset_parameters(kSeed);
  compiled->reset_parameters(kSeed);
  compiled->set_compiled(true);
  auto a = hand_loop(*plain, 5), b = hand_loop(*compiled, 5);
  plain->scale = compiled->scale = 0.5;
  nn::record_modules_again(*compiled);
  auto a2 = hand_loop(*plain, 5), b2 = hand_loop(*compiled, 5);
  CHECK(a == b);
  CHECK(a2 == b2);
  const nn::ModuleCompileStats s = compiled->compile_stats();
  CHECK(s.recaptures == 1);
  CHECK(s.replayed == (5 - 3) + (5 - 2));
}

TEST_CASE("compiled modules: eval and no-grad calls run eagerly; train() records again", "[compile]") {
  auto net = std::make_shared<TwoLayer>();
  net->reset_parameters(kSeed);
  net->set_compiled(true);
  hand_loop(*net, 5);
  CHECK(net->compile_stats().replayed == 2);
  Tensor x = randn({6, 8}, PhiloxKey{kSeed, 99});
  Tensor eager_out;
  {
    NoGradGuard no_grad;
    eager_out = net->forward(x);
    CHECK(bitwise_equal((*net)(x), eager_out));
  }
  CHECK(net->compile_stats().calls == 5);  // the no-grad call is not a training call
  net->eval();
  hand_loop(*net, 1);
  net->train();
  hand_loop(*net, 1);
  const nn::ModuleCompileStats s = net->compile_stats();
  CHECK(s.recaptures == 2);  // eval, then train again: another mode each time
  CHECK(s.refused.empty());
}

TEST_CASE("compiled modules: a module that reads its values on the host runs eagerly, with the reason", "[compile][errors]") {
  auto plain = std::make_shared<HostBranch>();
  auto compiled = std::make_shared<HostBranch>();
  plain->reset_parameters(kSeed);
  compiled->reset_parameters(kSeed);
  compiled->set_compiled(true);
  CHECK(hand_loop(*plain, 6) == hand_loop(*compiled, 6));
  const nn::ModuleCompileStats s = compiled->compile_stats();
  INFO(s.refused);
  CHECK(contains(s.refused, "'HostBranch'"));
  CHECK(contains(s.refused, "the host read the values of Tensor(float32, cpu, shape=[])"));
  CHECK(s.replayed == 0);
}

// ---- what a replay would not see: the guard records again ---------------------------------------------------------

// A layer that reads two tensors of its own beside its parameters: `shift`,
// a plain member, and `scale`, a registered (non-persistent) buffer.
struct ShiftedLinear : nn::UnaryModule {
  std::shared_ptr<nn::Linear> linear;
  Tensor shift = zeros({8});
  Tensor scale;
  ShiftedLinear() : UnaryModule("ShiftedLinear") {
    linear = child("linear", std::make_shared<nn::Linear>(8, 8));
    buffer("scale", scale, full({8}, 1.0), /*persistent=*/false);
  }
  Tensor forward(const Tensor& x) override { return (*linear)(x) * scale + shift; }
};
struct Shifted : nn::Module {
  std::shared_ptr<ShiftedLinear> body;
  Shifted() : nn::Module("Shifted") { body = child("body", std::make_shared<ShiftedLinear>()); }
  Tensor loss(const Tensor& x, const Tensor& y) {
    Tensor d = (*body)(x) - y;
    return mean(d * d);
  }
};

// 9 steps of Shifted with `o`, calling change(model, step) before each
// step's forward_backward: every loss's bits, then the parameters' hash.
struct ShiftedRun {
  std::vector<double> losses;
  std::string hash;
  CompileStats stats;
};
ShiftedRun train_shifted(RunOptions o, const std::function<void(Shifted&, int)>& change, bool compiled_body = false) {
  auto model = std::make_shared<Shifted>();
  model->reset_parameters(kSeed);
  if (compiled_body) model->body->set_compiled(true);
  auto run = parallelize(model, adamw(), o);
  ShiftedRun r;
  for (int step = 0; step < 9; ++step) {
    const Tensor x = randn({4, 8}, PhiloxKey{kSeed, uint64_t(2 * step)});
    const Tensor y = randn({4, 8}, PhiloxKey{kSeed, uint64_t(2 * step + 1)});
    change(run.model(), step);
    r.losses.push_back(run.forward_backward(x, y).loss_sum);
    run.step_optimizer();
  }
  r.hash = run.param_hash();
  r.stats = run.compile_stats();
  return r;
}

TEST_CASE("compile: a tensor of the model replaced after replays began records again, the eager bits", "[compile]") {
  // After the replays began (step 4): at step 5 the plain member is
  // assigned a new tensor (the old one dropped), at step 7 the registered
  // buffer (the old one kept alive here). A replay would read the old ones.
  std::vector<Tensor> kept;
  const auto change = [&kept](Shifted& m, int step) {
    if (step == 4) m.body->shift = full({8}, 0.5);
    if (step == 6) {
      kept.push_back(m.body->scale);
      m.body->scale = full({8}, 3.0);
    }
  };
  const ShiftedRun eager = train_shifted(RunOptions{}, change);
  for (bool mixed : {false, true}) {
    INFO((mixed ? "mixed mode (the body compiled)" : "the whole step compiled"));
    RunOptions o;
    o.compile = !mixed;
    const ShiftedRun compiled = train_shifted(o, change, mixed);
    CHECK(compiled.losses == eager.losses);
    CHECK(compiled.hash == eager.hash);
    if (mixed) {
      CHECK(compiled.stats.modules.recaptures == 2);
      CHECK(compiled.stats.modules.refused.empty());
    } else {
      CHECK(compiled.stats.recaptures == 2);
      CHECK(compiled.stats.refused.empty());
      CHECK(compiled.stats.replays == 9 - 3 - 2 * 2);  // steps 4 and 9 (steps 5-6 and 7-8 recorded again)
    }
  }
}

// Between steps a replayed step's arena is given back once the optimizer
// has used the gradients, as eager frees them (memory for an evaluation
// between steps); a gradient the caller keeps keeps it, with its values.
TEST_CASE("compile: a loop of your own runs eagerly, warns once and counts its steps as eager", "[compile]") {
  auto train = [](bool compile) {
    auto model = std::make_shared<Shifted>();
    model->reset_parameters(kSeed);
    RunOptions o;
    o.compile = compile;
    auto run = parallelize(model, adamw(), o);
    for (int step = 0; step < 5; ++step) {
      const Tensor x = randn({4, 8}, PhiloxKey{kSeed, uint64_t(2 * step)});
      const Tensor y = randn({4, 8}, PhiloxKey{kSeed, uint64_t(2 * step + 1)});
      run.model().loss(run.input(x), run.input(y)).backward();  // (not run.forward_backward: nothing is recorded)
      run.step_optimizer();
    }
    return std::make_pair(run.param_hash(), run.compile_stats());
  };
  const auto [eager_hash, eager_stats] = train(false);
  const auto [hash, stats] = train(true);
  CHECK(hash == eager_hash);
  CHECK(stats.eager_steps == 5);
  CHECK(stats.captures == 0);
  CHECK(stats.replays == 0);
  CHECK_THAT(stats.refused, Catch::Contains("records the steps of run.forward_backward(inputs, targets)") &&
                                Catch::Contains("in a loop of its own, which runs eagerly"));
}

TEST_CASE("compile: a step of your own as the loss function (one device) replays with the eager bits", "[compile]") {
  // Two losses added (a second head's, here the same body on a shifted
  // input): what a loop of one's own would backpropagate, given to
  // parallelize so that forward_backward -- and compile mode -- runs it.
  const RunLossFn two_losses = [](nn::Module& m, const Tensor& x, const Tensor& y) {
    auto& s = static_cast<Shifted&>(m);
    return s.loss(x, y) + s.loss(x * Scalar(0.5), y) * Scalar(0.25);
  };
  auto train = [&](bool compile) {
    auto model = std::make_shared<Shifted>();
    model->reset_parameters(kSeed);
    RunOptions o;
    o.compile = compile;
    auto run = parallelize(model, adamw(), o, two_losses);
    std::vector<uint64_t> losses;
    for (int step = 0; step < 6; ++step) {
      const Tensor x = randn({4, 8}, PhiloxKey{kSeed, uint64_t(2 * step)});
      const Tensor y = randn({4, 8}, PhiloxKey{kSeed, uint64_t(2 * step + 1)});
      losses.push_back(bits(run.forward_backward(x, y).loss_sum));
      run.step_optimizer();
    }
    return std::make_tuple(losses, run.param_hash(), run.compile_stats());
  };
  const auto [eager_losses, eager_hash, eager_stats] = train(false);
  const auto [losses, hash, stats] = train(true);
  CHECK(losses == eager_losses);
  CHECK(hash == eager_hash);
  CHECK(stats.replays == 3);
  CHECK(stats.refused.empty());
}

TEST_CASE("compile: between steps the arena is given back, unless the caller holds a gradient", "[compile]") {
  auto model = std::make_shared<Shifted>();
  model->reset_parameters(kSeed);
  RunOptions o;
  o.compile = true;
  auto run = parallelize(model, adamw(), o);
  const Tensor x = randn({4, 8}, PhiloxKey{kSeed, 1}), y = randn({4, 8}, PhiloxKey{kSeed, 2});
  for (int step = 0; step < 4; ++step) {
    run.forward_backward(x, y);
    run.step_optimizer();
  }
  REQUIRE(run.compile_stats().replays == 1);
  const int64_t inputs = 0;  // (the replay reads x and y where they are: Program::bind_input)
  CHECK(run.compile_stats().held_bytes == inputs);
  run.forward_backward(x, y);
  const Tensor kept = run.model().body->linear->weight.grad();
  const Tensor values = kept.clone();
  run.step_optimizer();
  CHECK(run.compile_stats().held_bytes > inputs);  // kept's memory is the arena's
  CHECK(bitwise_equal(kept, values));
  // The next replays leave kept as it was (eager's next step writes new
  // gradients too), and so does the end of the recording.
  run.forward_backward(x, y);
  const Tensor next = run.model().body->linear->weight.grad();
  CHECK(!bitwise_equal(next, values));  // (the parameters moved: another gradient)
  CHECK(bitwise_equal(kept, values));
  run.step_optimizer();
  CHECK(run.compile_stats().replays == 3);
  run.record_again();
  for (int step = 0; step < 3; ++step) {
    run.forward_backward(x, y);
    run.step_optimizer();
  }
  CHECK(run.compile_stats().recaptures == 1);
  CHECK(bitwise_equal(kept, values));
}

TEST_CASE("compile: an autocast opened around forward_backward after replays began records again", "[compile]") {
  const auto run_with = [](bool compile) {
    auto model = std::make_shared<Shifted>();
    model->reset_parameters(kSeed);
    RunOptions o;
    o.compile = compile;
    auto run = parallelize(model, adamw(), o);
    std::vector<double> losses;
    for (int step = 0; step < 8; ++step) {
      const Tensor x = randn({4, 8}, PhiloxKey{kSeed, uint64_t(2 * step)});
      const Tensor y = randn({4, 8}, PhiloxKey{kSeed, uint64_t(2 * step + 1)});
      std::optional<nn::AutocastScope> autocast;
      if (step >= 5) autocast.emplace(DType::BFloat16);
      losses.push_back(run.forward_backward(x, y).loss_sum);
      autocast.reset();
      run.step_optimizer();
    }
    return std::make_pair(losses, run.compile_stats());
  };
  const auto [eager, eager_stats] = run_with(false);
  const auto [compiled, stats] = run_with(true);
  CHECK(compiled == eager);
  CHECK(eager[5] != eager[4]);  // (the bfloat16 steps differ)
  CHECK(stats.recaptures == 1);
  CHECK(stats.replays == 8 - 3 - 2);  // steps 4 and 8
}

TEST_CASE("compile: an out-of-range token id in a replayed step is eager's error, with the position and range",
          "[compile][errors]") {
  const models::ModelConfig cfg = models::model_config("nanogpt", "tiny");
  RunOptions o;
  o.compile = true;
  auto run = parallelize(models::make_language_model(cfg, kSeed), adamw(), o);
  Tensor tokens = randint({2, 17}, kSeed, 0, cfg.vocab_size);
  for (int step = 0; step < 4; ++step) {
    run.forward_backward(tokens.narrow(1, 0, 16).contiguous(), tokens.narrow(1, 1, 16).contiguous());
    run.step_optimizer();
  }
  REQUIRE(run.compile_stats().replays == 1);
  Tensor ids = tokens.narrow(1, 0, 16).contiguous();
  ids.data<int64_t>()[16 + 3] = cfg.vocab_size + 5;  // row 1, column 3
  const std::string e = error_of([&] { run.forward_backward(ids, tokens.narrow(1, 1, 16).contiguous()); });
  CHECK(contains(e, fmt::format("index {} at position [1, 3]", cfg.vocab_size + 5)));
  CHECK(contains(e, fmt::format("is out of range; valid range is [0, {})", cfg.vocab_size)));
}

TEST_CASE("a parameter assigned a new tensor after parallelize is an error naming it, eager or compiled",
          "[compile][errors]") {
  for (bool compile : {false, true}) {
    INFO("compile " << compile);
    RunOptions o;
    o.compile = compile;
    const std::string e = error_of([&] {
      train_shifted(o, [](Shifted& m, int step) {
        if (step == 5) m.body->linear->weight = full({8, 8}, 0.1).requires_grad_(true);
      });
    });
    CHECK(contains(e, "parameter 'body.linear.weight' of"));
    CHECK(contains(e, "was assigned a new tensor"));
  }
}

TEST_CASE("compiled modules: what this version does not do is an error naming it", "[compile][errors]") {
  auto model = [] { return models::make_language_model(models::model_config("nanogpt", "tiny"), kSeed); };
  RunOptions o;
  o.compile_modules = nn::CompileModules::Blocks;
  o.compile = true;
  CHECK(contains(error_of([&] { parallelize(model(), adamw(), o); }),
                 "RunOptions::compile_modules = blocks with compile (the whole step is recorded already)"));
  o.compile = false;
  o.recompute = nn::Recompute::Full;
  CHECK(contains(error_of([&] { parallelize(model(), adamw(), o); }), "with recompute"));
  CHECK(contains(error_of([&] { parallelize(model(), adamw(), o); }),
                 "compile_modules = blocks with recompute = full: a block is either recomputed or compiled"));
  o.recompute = nn::Recompute::None;
  auto mixtral = models::make_language_model(models::model_config("mixtral", "tiny"), kSeed);
  CHECK(contains(error_of([&] { parallelize(mixtral, adamw(), o); }),
                 "block 'layers.0' holds an MoE layer, which routes tokens on the host"));
  CHECK(contains(error_of([] { nn::parse_compile_modules("all"); }), "none, attention, blocks"));
  // On a model with MoE layers `compile` alone is mixed mode already.
  o.compile = true;
  o.compile_modules = nn::CompileModules::Attention;
  CHECK(contains(error_of([&] { parallelize(mixtral, adamw(), o); }),
                 "a model with MoE layers: there compile alone is already mixed mode"));
  // Nothing to mark: an error, not a silently eager run.
  auto mlp = std::make_shared<TwoLayer>();
  CHECK(contains(error_of([&] { nn::apply_compile_modules(*mlp, nn::CompileModules::Attention); }),
                 "compile_modules = attention marks every nn::Attention module, and TwoLayer has none"));
  auto net = std::make_shared<TwoLayer>();
  net->set_recompute(true);
  CHECK(contains(error_of([&] { net->set_compiled(true); }), "either recomputed or compiled"));
  net->set_recompute(false);
  net->set_compiled(true);
  CHECK(contains(error_of([&] { net->set_recompute(true); }), "either recomputed or compiled"));
}
