// Activation recomputation (nn/recompute.h): the replayed backward gives the
// gradients of the recorded one bit for bit; `tessel train --recompute
// selective|full` gives the bits of `none` in bitwise mode, with dropout, on
// one device, dp x tp, tp with sequence parallel, pp, cp and ep; full keeps
// less memory; misuse is an error naming the piece.
#include <catch2/catch.hpp>

#include <filesystem>
#include <map>
#include <mutex>

#include "autograd/api.h"
#include "nn/linear.h"
#include "nn/recompute.h"
#include "run/run.h"
#include "test/run/mlp_classifier.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/metrics.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::train;
namespace fs = std::filesystem;

namespace {

// A piece with two parameters, a nonlinearity and an input used twice.
Tensor piece(const Tensor& x, const Tensor& w, const Tensor& b) { return gelu(matmul(x, w) + b) * x + x; }

TrainConfig tiny(const std::string& model, const std::string& recompute, const std::string& mesh) {
  TrainConfig c;
  c.model = model;
  c.model_config = "tiny";
  c.steps = 4;
  c.batch_size = 8;
  c.seq_len = 32;
  c.dropout = 0.1;
  c.bitwise = true;
  c.eval_every = 0;
  c.sample_length = 0;
  c.recompute = recompute;
  c.mesh = mesh;
  c.out_dir = testing::scratch_dir("recompute_" + model + "_" + recompute + "_" + std::to_string(std::hash<std::string>()(mesh)));
  return c;
}

std::vector<std::pair<double, std::string>> trace(const TrainConfig& c, TrainResult* result = nullptr) {
  TrainResult r = run_training(c, {nullptr, /*quiet=*/true});
  if (result) *result = r;
  std::vector<std::pair<double, std::string>> out;
  for (const auto& m : read_metrics(fs::path(c.out_dir) / "metrics.jsonl")) out.emplace_back(*m.loss, m.param_hash);
  return out;
}

}  // namespace

TEST_CASE("recompute: the replayed backward gives the recorded gradients bit for bit", "[recompute]") {
  const Tensor w0 = testing::uniform({6, 6}, 1), b0 = testing::uniform({6}, 2), x0 = testing::uniform({4, 6}, 3);
  auto grads = [&](bool replay) {
    Tensor w = w0.detach().requires_grad_(), b = b0.detach().requires_grad_(), x = x0.detach().requires_grad_();
    Tensor h = x * 2.0;
    Tensor y = replay ? nn::recompute(
                            "piece", [&](const std::vector<Tensor>& in) { return piece(in[0], w, b); }, {h}, {w, b})
                      : piece(h, w, b);
    sum(y * y).backward();
    return std::vector<Tensor>{x.grad(), w.grad(), b.grad()};
  };
  const auto plain = grads(false), replayed = grads(true);
  for (size_t i = 0; i < plain.size(); ++i) CHECK(testing::bitwise_equal(plain[i], replayed[i]));
  // Without grad mode nothing is kept and the value is the piece's.
  NoGradGuard ng;
  CHECK(testing::bitwise_equal(
      nn::recompute("piece", [&](const std::vector<Tensor>& in) { return piece(in[0], w0, b0); }, {x0}, {w0, b0}),
      piece(x0, w0, b0)));
}

TEST_CASE("recompute: misuse is an error naming the piece", "[recompute]") {
  Tensor w = testing::uniform({3, 3}, 4).requires_grad_(), x = testing::uniform({2, 3}, 5).requires_grad_();
  {
    // An input changed in place between the forward and the backward.
    Tensor h = x * 1.0;
    Tensor y = nn::recompute("block 7", [&](const std::vector<Tensor>& in) { return matmul(in[0], w); }, {h}, {w});
    {
      NoGradGuard ng;
      h.add_(1.0);
    }
    CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains("'block 7'") && Catch::Contains("modified by an in-place"));
  }
  {
    // A parameter changed in place (an optimizer step before the backward).
    Tensor y = nn::recompute("block 8", [&](const std::vector<Tensor>& in) { return matmul(in[0], w); }, {x}, {w});
    {
      NoGradGuard ng;
      w.mul_(0.5);
    }
    CHECK_THROWS_WITH(sum(y).backward(), Catch::Contains("'block 8'") && Catch::Contains("changed in place"));
  }
  // A piece returning its input has nothing to recompute.
  CHECK_THROWS_WITH(
      nn::recompute("same", [](const std::vector<Tensor>& in) { return in[0]; }, {x}, {}),
      Catch::Contains("'same'") && Catch::Contains("shares memory with an input"));
  CHECK_THROWS_WITH(nn::parse_recompute("some"), Catch::Contains("none, selective, full"));
  // full needs blocks; FSDP is refused before anything runs.
  auto lin = std::make_shared<nn::Linear>(3, 3);
  CHECK_THROWS_WITH(nn::apply_recompute(*lin, nn::Recompute::Full), Catch::Contains("not one"));
  TrainConfig c = tiny("llama", "full", "dp=2");
  c.zero = 3;
  CHECK_THROWS_WITH(run_training(c, {nullptr, true}), Catch::Contains("recompute = full with zero = 3"));
  c.recompute = "most";
  c.zero = 0;
  CHECK_THROWS_WITH(run_training(c, {nullptr, true}), Catch::Contains("recompute must be one of none | selective | full"));
}

TEST_CASE("recompute: selective and full give the bits of none on every layout (bitwise, dropout on)",
          "[recompute]") {
  struct Layout {
    std::string model, mesh;
    bool sp = false;
    int64_t micro = 1;
    int64_t batch = 8;
  };
  const std::vector<Layout> layouts = {
      {"llama", ""},           {"llama", "dp=2,tp=2"}, {"nanogpt", "tp=2", true}, {"llama", "pp=2", false, 2},
      {"llama", "dp=2,cp=2", false, 1, 2},  {"mixtral", "ep=2"},
  };
  for (const Layout& l : layouts) {
    auto config = [&](const char* policy) {
      TrainConfig c = tiny(l.model, policy, l.mesh);
      c.sequence_parallel = l.sp;
      c.micro_batches = l.micro;
      c.batch_size = l.batch;  // cp: one sequence per dp rank, so attention is load-balanced over cp
      return c;
    };
    const auto none = trace(config("none"));
    for (const char* policy : {"selective", "full"}) {
      INFO(l.model << " on '" << l.mesh << "' sp=" << l.sp << " recompute=" << policy);
      if (l.model == "mixtral" && std::string(policy) == "full") {
        // The router's auxiliary loss is read after the block: refused, not dropped.
        CHECK_THROWS_WITH(trace(config(policy)), Catch::Contains("auxiliary loss"));
        continue;
      }
      const auto got = trace(config(policy));
      REQUIRE(got.size() == none.size());
      for (size_t i = 0; i < got.size(); ++i) {
        CHECK(got[i].first == none[i].first);
        CHECK(got[i].second == none[i].second);
      }
    }
  }
}

TEST_CASE("recompute: full keeps only the blocks' inputs (allocator peak)", "[recompute]") {
  std::map<std::string, int64_t> peak;
  for (const char* policy : {"none", "selective", "full"}) {
    TrainConfig c = tiny("llama", policy, "");
    c.steps = 2;
    c.seq_len = 64;
    c.batch_size = 16;
    c.dropout = 0;
    c.bitwise = false;
    TrainResult r;
    trace(c, &r);
    peak[policy] = r.allocator_peak_bytes;
  }
  INFO("peak none " << peak["none"] << ", selective " << peak["selective"] << ", full " << peak["full"]);
  CHECK(peak["selective"] < peak["none"]);
  CHECK(peak["full"] < peak["none"] * 3 / 4);
}

TEST_CASE("recompute: a user's own blocks marked set_recompute(true), through tessel::Run on dp=2,tp=2", "[recompute]") {
  // The loop of docs/your_model.md with the model of test/run (written
  // against tessel.h); blocks called through their hooks, so the marks apply.
  testing::MlpConfig cfg;
  cfg.call_blocks_through_hooks = true;
  auto run_on = [&](const std::vector<Mesh::DimSpec>& dims, bool marked) {
    std::vector<double> losses;
    std::string hash;
    std::mutex mu;
    numerics::BitwiseGuard bitwise(true);
    int ranks = 1;
    for (const auto& d : dims) ranks *= int(d.size);
    launch(ranks, [&](int rank) {
      auto model = nn::make_model<testing::MlpClassifier>(cfg);
      model->reset_parameters(3);
      for (auto& b : model->blocks) b->set_recompute(marked);
      RunOptions o;
      o.seed = 3;
      auto run = parallelize(model, dims.empty() ? nullptr : Mesh::world(dims), testing::mlp_plan(), adamw({1e-2}), o);
      std::vector<double> mine;
      for (int64_t step = 0; step < 4; ++step) {
        auto [xs, ys] = testing::mlp_batch(cfg, 16, 3, step);
        Tensor l = run.model().loss(run.input(xs), run.input(ys));
        mine.push_back(l.item<double>());
        l.backward();
        run.step_optimizer();
      }
      const std::string h = run.param_hash();
      if (rank == 0) {
        std::lock_guard<std::mutex> lk(mu);
        losses = mine;
        hash = h;
      }
    });
    return std::make_pair(losses, hash);
  };
  const auto one = run_on({}, false);
  for (bool marked : {false, true}) {
    INFO("marked=" << marked);
    const auto got = run_on({{"dp", 2}, {"tp", 2}}, marked);
    CHECK(got.first == one.first);
    CHECK(got.second == one.second);
  }
  CHECK(run_on({}, true) == one);
}
