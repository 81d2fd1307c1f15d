// Device graphs of a replay (runtime/capture.h, "device graphs";
// docs/compile.md, "On a GPU"), on the CPU with a fake graph backend that
// behaves as CUDA's does: a capture records the launches without running
// them and refuses the kernels it is told to (as CUDA's refuses a launch
// that synchronises), and a graph's launch runs them -- after checking that
// every buffer is where it was at the capture, which a real graph's
// baked-in addresses require. The CUDA backend itself (kernels/cuda/graph.cc)
// runs in gpu_tests.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels/fused_chain.h"
#include "models/language_model.h"
#include "runtime/capture.h"
#include "tessel.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

constexpr uint64_t kSeed = 17;

std::vector<void*> addresses_of(const std::vector<capture::Launch*>& launches) {
  std::vector<const capture::TensorArg*> args;
  for (const capture::Launch* l : launches) l->tensor_args(args);
  std::vector<void*> out;
  for (const capture::TensorArg* a : args) out.push_back(a->view.defined() ? a->view.storage()->data() : nullptr);
  return out;
}

struct FakeGraphs final : capture::GraphBackend {
  std::set<std::string> refuse;  // kernel names a capture refuses
  std::string refuse_prefix;      // and names that begin with this ("fused(": a device's fused chain)
  bool fail_whole = false;        // every capture fails as a whole (GraphRefused with no launch)
  int64_t captures = 0, launched = 0;
  int64_t chains_captured = 0;    // fused chains captured as one launch of a graph
  int64_t stale = 0;  // graphs launched with a buffer elsewhere than at their capture (must stay 0)

  struct Graph final : capture::Graph {
    FakeGraphs* owner = nullptr;
    std::vector<capture::Launch*> launches;
    std::vector<void*> addresses;  // at the capture
    void launch() override {
      // A real graph would read and write the memory it was captured with:
      // counted, and not run (each test checks stale == 0).
      if (addresses_of(launches) != addresses) {
        ++owner->stale;
        return;
      }
      for (capture::Launch* l : launches) l->run();
      owner->launched += int64_t(launches.size());
    }
  };

  std::unique_ptr<capture::Graph> capture(Device, const std::vector<capture::Launch*>& launches) override {
    ++captures;
    if (fail_whole) throw capture::GraphRefused("the fake backend fails the whole capture", -1);
    for (size_t i = 0; i < launches.size(); ++i) {
      const std::string name = launches[i]->name;
      if (refuse.count(name) || (!refuse_prefix.empty() && name.rfind(refuse_prefix, 0) == 0))
        throw capture::GraphRefused("the fake backend refuses '" + name + "'", int64_t(i));
    }
    for (const capture::Launch* l : launches) chains_captured += std::string(l->name).rfind("fused(", 0) == 0;
    auto g = std::make_unique<Graph>();
    g->owner = this;
    g->launches = launches;
    g->addresses = addresses_of(launches);
    return g;
  }
};

// The fake backend as the CPU's for the scope (the CPU has none).
struct FakeOnCpu {
  FakeGraphs graphs;
  FakeOnCpu() { capture::set_graph_backend(DeviceType::CPU, &graphs); }
  ~FakeOnCpu() { capture::set_graph_backend(DeviceType::CPU, nullptr); }
};

struct Trained {
  std::vector<double> losses, norms;
  std::string hash;
  CompileStats stats;
};

// The host fused backend as the CPU's for the scope: CPU chains become one
// "kernel" each, as a GPU's (kernels/fused_chain.h).
struct FusedOnCpu {
  FusedOnCpu() { capture::set_fused_backend(DeviceType::CPU, kernels::host_fused_backend()); }
  ~FusedOnCpu() { capture::set_fused_backend(DeviceType::CPU, nullptr); }
};

// 9 steps of tiny NanoGPT (or `arch`) with dropout through tessel::Run.
Trained train(bool compile, bool graphs, const char* arch = "nanogpt") {
  models::ModelConfig cfg = models::model_config(arch, "tiny");
  cfg.dropout = 0.1;
  auto model = models::make_language_model(cfg, kSeed);
  RunOptions o;
  o.seed = kSeed;
  o.clip = 1.0;
  o.compile = compile;
  o.compile_graphs = graphs;
  auto run = parallelize(model, adamw({1e-3}), o);
  Trained t;
  // One batch buffer, refilled: the replays read it in place (on the CPU the
  // batch is bound, not copied), so its address stays -- as a GPU's input
  // buffers, which a replay copies the batch into, do.
  Tensor x = zeros({4, 32}, TensorOptions(DType::Int64)), y = zeros({4, 32}, TensorOptions(DType::Int64));
  for (uint64_t step = 0; step < 9; ++step) {
    Tensor tokens = randint({4, 33}, kSeed * 100 + step, 0, cfg.vocab_size);
    {
      NoGradGuard no_grad;
      x.copy_(tokens.narrow(1, 0, 32));
      y.copy_(tokens.narrow(1, 1, 32));
    }
    t.losses.push_back(run.forward_backward(x, y).loss_sum);
    t.norms.push_back(run.step_optimizer().grad_norm);
  }
  t.hash = run.param_hash();
  t.stats = run.compile_stats();
  return t;
}

// A compiled run gave the eager run's losses, gradient norms and parameters, bit for bit.
void check_eager_bits(const Trained& compiled, const Trained& eager) {
  CHECK(compiled.losses == eager.losses);
  CHECK(compiled.norms == eager.norms);
  CHECK(compiled.hash == eager.hash);
}

}  // namespace

TEST_CASE("graphs: a replay launches its runs of kernels as graphs, with the eager bits", "[compile][graphs]") {
  const Trained eager = train(false, false);
  FakeOnCpu fake;
  const Trained graphed = train(true, true);
  check_eager_bits(graphed, eager);
  const CompileStats& c = graphed.stats;
  INFO(c.refused << " / " << c.graph_refusal);
  CHECK(c.refused.empty());
  CHECK(c.replays == 6);
  CHECK(c.graphs > 0);
  CHECK(c.graph_refused == 0);
  CHECK(c.graph_captures == c.graphs);  // once each, at the first replay
  // Dropout's launches take a key re-made at every replay: they run from the
  // host, between graphs.
  CHECK(c.graph_launches > c.launches / 2);
  CHECK(c.graph_launches < c.launches);
  CHECK(fake.graphs.launched == c.graph_launches * c.replays);
  CHECK(fake.graphs.stale == 0);
  // compile_graphs = false: no graph.
  const Trained plain = train(true, false);
  CHECK(plain.stats.graphs == 0);
  CHECK(plain.stats.graph_captures == 0);
  CHECK(plain.hash == eager.hash);
  // TESSEL_CUDA_GRAPHS=0: none either, whatever the options ask.
  setenv("TESSEL_CUDA_GRAPHS", "0", 1);
  const Trained off = train(true, true);
  unsetenv("TESSEL_CUDA_GRAPHS");
  CHECK(off.stats.graphs == 0);
  CHECK(off.stats.graph_captures == 0);
  CHECK(off.hash == eager.hash);
}

TEST_CASE("graphs: a launch a capture refuses runs from the host and splits its run; the eager bits",
          "[compile][graphs]") {
  const Trained eager = train(false, false);
  FakeOnCpu fake;
  fake.graphs.refuse = {"layer_norm_forward"};
  const Trained graphed = train(true, true);
  check_eager_bits(graphed, eager);
  const CompileStats& c = graphed.stats;
  CHECK(c.refused.empty());
  CHECK(c.graph_refused >= 1);
  CHECK(c.graph_refusal.find("layer_norm_forward") != std::string::npos);
  CHECK(c.graphs > 0);
  CHECK(fake.graphs.stale == 0);
}

TEST_CASE("graphs: a graph whose buffers moved is captured again; after three moves its launches run from the host",
          "[compile][graphs]") {
  FakeOnCpu fake;
  const int64_t n = 256;
  Tensor recorded = randn({n}, PhiloxKey{kSeed, 1});
  std::unique_ptr<capture::Program> p;
  Tensor y;
  int out = -1;
  auto step = [](const Tensor& in) { return exp(in * Scalar(0.5)) + in; };
  {
    NoGradGuard no_grad;
    capture::Recorder rec("moves");
    rec.fuse_elementwise = false;  // (launches, not a fused chain: the graph's)
    rec.input(recorded);
    y = step(recorded);
    out = rec.output(y);
    p = rec.finish();
  }
  p->use_graphs(true);
  std::vector<Tensor> inputs;
  for (uint64_t k = 0; k < 6; ++k) inputs.push_back(randn({n}, PhiloxKey{kSeed, 10 + k}));
  // bind_input points the input buffer at each caller's tensor: it moves at every replay.
  for (size_t k = 0; k < inputs.size(); ++k) {
    INFO("replay " << k);
    p->bind_input(0, inputs[k]);
    p->replay();
    NoGradGuard no_grad;
    CHECK(bitwise_equal(p->output(out, y), step(inputs[k])));
  }
  const capture::Program::GraphStats g = p->graph_stats();
  CHECK(g.captures == 4);  // the first, then three moves
  CHECK(g.refused == 1);   // the fourth move: from the host for good
  CHECK(g.graphs == 0);
  CHECK(g.last_refusal.find("moved") != std::string::npos);
  CHECK(fake.graphs.stale == 0);

  // The same input each time: one capture, and the arenas are held while
  // the graph exists (it bakes in their addresses).
  p->use_graphs(false);
  p->use_graphs(true);
  for (int k = 0; k < 3; ++k) {
    p->bind_input(0, inputs[0]);
    p->replay();
  }
  CHECK(p->graph_stats().graphs == 1);
  CHECK(p->graph_stats().captures == g.captures + 1);
  CHECK(!p->release_unheld());
  CHECK(p->held_bytes() == p->bytes());
  CHECK(fake.graphs.stale == 0);
}

// A small program of elementwise launches, recorded without fusion (each
// launch its own, so the graph's).
struct Elementwise {
  std::unique_ptr<capture::Program> p;
  Tensor y;
  int out = -1;
  static Tensor step(const Tensor& in) { return neg(exp(in * in) + in) * in; }
  Elementwise() {
    NoGradGuard no_grad;
    Tensor in = randn({64}, PhiloxKey{kSeed, 40});
    capture::Recorder rec("elementwise");
    rec.fuse_elementwise = false;
    rec.input(in);
    y = step(in);
    out = rec.output(y);
    p = rec.finish();
    p->use_graphs(true);
  }
  // Replays with a new input each time (copied in: the buffer stays); true
  // when every replay gave the eager bits.
  bool replays(int n) {
    bool ok = true;
    for (int k = 0; k < n; ++k) {
      NoGradGuard no_grad;
      const Tensor x = randn({64}, PhiloxKey{kSeed, 50 + uint64_t(k)});
      p->set_input(0, x);
      p->replay();
      ok = ok && bitwise_equal(p->output(out, y), step(x));
    }
    return ok;
  }
};

TEST_CASE("graphs: refused launches split their run until every part is a graph or runs from the host",
          "[compile][graphs]") {
  FakeOnCpu fake;
  {
    Elementwise e;
    const int64_t n = e.p->launches();
    REQUIRE(n >= 5);  // mul, exp, add, neg, mul
    CHECK(e.replays(2));
    CHECK(e.p->graph_stats().graphs == 1);  // the whole program
    CHECK(e.p->graph_stats().graph_launches == n);
  }
  {
    // Every unary launch refused: the run splits at each, one capture at a
    // time (a replay finds the next refusal), and every replay is right.
    fake.graphs.refuse = {"unary"};
    Elementwise e;
    CHECK(e.replays(5));
    const capture::Program::GraphStats g = e.p->graph_stats();
    INFO(g.last_refusal);
    CHECK(g.refused == 2);  // exp, then neg
    CHECK(g.last_refusal.find("unary") != std::string::npos);
    CHECK(g.captures == g.graphs + g.refused);
    CHECK(fake.graphs.stale == 0);
  }
  {
    // A capture that fails as a whole: its run launches from the host for good.
    fake.graphs.refuse.clear();
    fake.graphs.fail_whole = true;
    Elementwise e;
    CHECK(e.replays(3));
    const capture::Program::GraphStats g = e.p->graph_stats();
    CHECK(g.graphs == 0);
    CHECK(g.captures == 1);
    CHECK(g.refused == 1);
  }
}

TEST_CASE("graphs: a device's fused chain is one launch of a graph; refused, it runs from the host; the eager bits",
          "[compile][graphs]") {
  // LLaMA: SwiGLU's chains. With a fused backend (the host's, as the CPU's)
  // each chain is one kernel, and a graph captures it as one launch.
  const Trained eager = train(false, false, "llama");
  FakeOnCpu fake;
  FusedOnCpu fused;
  const Trained graphed = train(true, true, "llama");
  check_eager_bits(graphed, eager);
  const CompileStats& c = graphed.stats;
  INFO(c.refused << " / " << c.graph_refusal);
  CHECK(c.refused.empty());
  CHECK(c.fused_chains >= 4);
  CHECK(c.graphs > 0);
  CHECK(fake.graphs.chains_captured > 0);
  CHECK(fake.graphs.stale == 0);
  // Every chain refused by its capture: it runs from the host (still one
  // kernel), the launches around it become graphs of their own.
  fake.graphs.refuse_prefix = "fused(";
  const Trained refused = train(true, true, "llama");
  CHECK(refused.losses == eager.losses);
  CHECK(refused.hash == eager.hash);
  CHECK(refused.stats.graph_refused >= 1);
  CHECK(refused.stats.graph_refusal.find("fused(") != std::string::npos);
  CHECK(refused.stats.graphs > 0);
  CHECK(fake.graphs.stale == 0);
}
