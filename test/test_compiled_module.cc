// Mixed mode (nn/compiled_module.h, docs/compile.md "Mixed mode"): chosen
// modules recorded and replayed, forward and backward, while the rest of the
// step runs eagerly -- with the eager run's bits, and never a stale replay.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "models/language_model.h"
#include "tessel.h"
#include "test/util/dist.h"
#include "test/util/error_of.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

constexpr uint64_t kSeed = 23;

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

uint64_t bits(double d) {
  uint64_t b;
  std::memcpy(&b, &d, 8);
  return b;
}

struct Result {
  std::vector<uint64_t> loss, grad_norm;  // bits, per step
  std::string param_hash;
  nn::ModuleCompileStats modules;
};

struct Spec {
  std::string arch = "nanogpt";
  nn::CompileModules modules = nn::CompileModules::None;
  double dropout = 0.1;
  int64_t steps = 12;
  int64_t micro_batches = 1;
  int64_t batch = 4, seq = 32;
  int64_t change_seq_at = 0, changed_seq = 16;  // a new sequence length from this step on (0: never)
  DType compute = DType::Float32;
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
  o.compile_modules = spec.modules;
  o.compute = spec.compute;
  bool tp = false;
  for (int d = 0; mesh && d < mesh->ndim(); ++d) tp = tp || mesh->name(d) == "tp";
  auto run = parallelize(model, mesh, mesh ? parallel::builtin_plan(spec.arch, tp) : parallel::ParallelPlan{},
                         adamw({1e-3}), o);
  Result r;
  for (int64_t step = 0; step < spec.steps; ++step) {
    const int64_t t = spec.change_seq_at > 0 && step >= spec.change_seq_at ? spec.changed_seq : spec.seq;
    Tensor tokens = randint({spec.batch, t + 1}, kSeed * 1000 + uint64_t(step), 0, cfg.vocab_size);
    Tensor x = tokens.narrow(1, 0, t).contiguous(), y = tokens.narrow(1, 1, t).contiguous();
    r.loss.push_back(bits(run.forward_backward(x, y).loss_sum));
    r.grad_norm.push_back(bits(run.step_optimizer().grad_norm));
  }
  r.param_hash = run.param_hash();
  r.modules = run.compile_stats().modules;
  return r;
}

void check_same(const Result& eager, const Result& compiled) {
  REQUIRE(eager.loss.size() == compiled.loss.size());
  for (size_t i = 0; i < eager.loss.size(); ++i) {
    INFO("step " << i + 1);
    CHECK(eager.loss[i] == compiled.loss[i]);
    CHECK(eager.grad_norm[i] == compiled.grad_norm[i]);
  }
  CHECK(eager.param_hash == compiled.param_hash);
}

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

TEST_CASE("compiled modules: blocks and attention layers replay with the eager bits (NanoGPT, LLaMA; fast and "
          "bitwise; dropout)",
          "[compile]") {
  for (const std::string arch : {"nanogpt", "llama"}) {
    for (const bool bitwise : {false, true}) {
      numerics::BitwiseGuard mode(bitwise);
      Spec spec;
      spec.arch = arch;
      const Result eager = train(spec);
      CHECK(eager.modules.modules == 0);
      for (const auto which : {nn::CompileModules::Blocks, nn::CompileModules::Attention}) {
        INFO(arch << (bitwise ? " bitwise " : " fast ") << nn::compile_modules_name(which));
        spec.modules = which;
        const Result compiled = train(spec);
        check_same(eager, compiled);
        const nn::ModuleCompileStats& m = compiled.modules;
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
  const Result eager = train(spec);
  spec.modules = nn::CompileModules::Blocks;
  const Result compiled = train(spec);
  check_same(eager, compiled);
  CHECK(compiled.modules.replayed == 2 * (2 * 8 - 3));  // every micro-batch's call counts

  Spec bf16;
  bf16.compute = DType::BFloat16;
  bf16.steps = 8;
  const Result eager16 = train(bf16);
  bf16.modules = nn::CompileModules::Blocks;
  const Result compiled16 = train(bf16);
  check_same(eager16, compiled16);
  CHECK(compiled16.modules.replayed == 2 * (8 - 3));

  Spec seq;
  seq.change_seq_at = 6;
  const Result eager_seq = train(seq);
  seq.modules = nn::CompileModules::Attention;
  const Result compiled_seq = train(seq);
  check_same(eager_seq, compiled_seq);
  CHECK(compiled_seq.modules.recaptures == 2);  // once per module
  CHECK(compiled_seq.modules.recordings == 2 * 4);
  CHECK(compiled_seq.modules.replayed == 2 * (12 - 3 - 2));
}

TEST_CASE("compiled modules: Mixtral's attention layers compile while its MoE layers run eagerly", "[compile]") {
  Spec spec;
  spec.arch = "mixtral";
  spec.steps = 8;
  const Result eager = train(spec);
  spec.modules = nn::CompileModules::Attention;
  const Result compiled = train(spec);
  check_same(eager, compiled);
  CHECK(compiled.modules.refused.empty());
  CHECK(compiled.modules.replayed == 2 * (8 - 3));
}

// On a mesh every rank records and replays its modules' kernels and
// collectives (tensor and sequence parallel, expert parallel beside them);
// in bitwise mode the one-device run's bits.
TEST_CASE("compiled modules on dp=2 x tp=2 + sp and dp=2 x ep=2: the one-device bits", "[compile][comm]") {
  numerics::BitwiseGuard bitwise(true);
  struct Layout {
    std::string arch;
    std::vector<Mesh::DimSpec> dims;
    nn::CompileModules modules;
  };
  for (const Layout& l : {Layout{"nanogpt", {{"dp", 2}, {"tp", 2}}, nn::CompileModules::Blocks},
                          Layout{"llama", {{"dp", 2}, {"tp", 2}}, nn::CompileModules::Attention},
                          Layout{"mixtral", {{"dp", 2}, {"ep", 2}}, nn::CompileModules::Attention}}) {
    INFO(l.arch << " " << nn::compile_modules_name(l.modules));
    Spec spec;
    spec.arch = l.arch;
    spec.steps = 8;
    spec.micro_batches = 2;
    const Result one = train(spec);
    spec.modules = l.modules;
    std::vector<Result> ranks(4);
    comm::run_local(4, [&](int rank) { ranks[size_t(rank)] = train(spec, Mesh::world(l.dims)); });
    for (int r = 0; r < 4; ++r) {
      INFO("rank " << r << ": " << ranks[size_t(r)].modules.refused);
      check_same(one, ranks[size_t(r)]);
      CHECK(ranks[size_t(r)].modules.refused.empty());
      CHECK(ranks[size_t(r)].modules.replayed == 2 * (2 * 8 - 3));
    }
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

TEST_CASE("compiled modules on dp=2: a refusal on one rank makes every rank run the module eagerly", "[compile][comm]") {
  std::vector<std::string> refused(2), hash(4);
  std::vector<int64_t> replayed(2, -1);
  comm::run_local(2, [&](int rank) {
    for (const bool compiled : {false, true}) {
      auto model = nn::make_model<RankDependentModel>();
      model->reset_parameters(kSeed);
      auto run = parallelize(model, Mesh::world({{"dp", 2}}), parallel::builtin_plan("none"), adamw({0.1}));
      if (compiled) run.model().body->set_compiled(true);
      for (int64_t step = 0; step < 6; ++step) {
        Tensor x = randn({4, 8}, PhiloxKey{kSeed, uint64_t(step)});
        run.model().loss(run.input(x)).backward();
        run.step_optimizer();
      }
      hash[size_t(2 * rank + int(compiled))] = run.param_hash();
      if (compiled) {
        refused[size_t(rank)] = run.model().body->compile_stats().refused;
        replayed[size_t(rank)] = run.model().body->compile_stats().replayed;
      }
    }
  });
  CHECK(contains(refused[0], "the host read the values of"));
  CHECK(contains(refused[1], "another rank's recording of this module was refused"));
  CHECK(replayed == std::vector<int64_t>{0, 0});
  CHECK(hash[0] == hash[1]);
  CHECK(hash[2] == hash[3]);
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
    CHECK(plain->compile_stats().calls == 0);
  }
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
  o.recompute = nn::Recompute::None;
  o.zero = 3;
  std::vector<std::string> fsdp(2);
  comm::run_local(2, [&](int rank) {
    fsdp[size_t(rank)] = error_of([&] { parallelize(model(), Mesh::world({{"dp", 2}}), parallel::ParallelPlan{}, adamw(), o); });
  });
  CHECK(contains(fsdp[0], "with zero = 3 (FSDP gathers parameters in module hooks"));
  o.zero = 0;
  auto mixtral = models::make_language_model(models::model_config("mixtral", "tiny"), kSeed);
  CHECK(contains(error_of([&] { parallelize(mixtral, adamw(), o); }),
                 "block 'layers.0' holds an MoE layer, which routes tokens on the host"));
  CHECK(contains(error_of([] { nn::parse_compile_modules("all"); }), "none, attention, blocks"));
  auto net = std::make_shared<TwoLayer>();
  net->set_recompute(true);
  CHECK(contains(error_of([&] { net->set_compiled(true); }), "either recomputed or compiled"));
  net->set_recompute(false);
  net->set_compiled(true);
  CHECK(contains(error_of([&] { net->set_recompute(true); }), "either recomputed or compiled"));
}
