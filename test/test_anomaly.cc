// Finding the NaN (autograd/anomaly.h) and stopping on one: anomaly detection
// names the op, backward node or optimizer update that first yields an inf or
// NaN -- with the step, the module, the inputs and which of them were already
// bad -- on one device and on a mesh; a Run stops before an update with a
// non-finite gradient norm; the trainer's --detect-anomaly and its dump;
// and out-of-memory errors name the op, the bytes and the allocator's use.
// Written against tessel.h, as a user would.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>

#include "tessel.h"
#include "test/run/mlp_classifier.h"
#include "test/util/dist.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/config.h"
#include "train/dump.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::testing;
namespace fs = std::filesystem;

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A module whose forward takes the log of its input (NaN for negative values).
class LogLayer : public nn::UnaryModule {
 public:
  LogLayer() : nn::UnaryModule("LogLayer") { fc = child("fc", std::make_shared<nn::Linear>(4, 4)); }
  Tensor forward(const Tensor& x) override { return log((*fc)(x)); }
  std::shared_ptr<nn::Linear> fc;
};

class Net : public nn::UnaryModule {
 public:
  Net() : nn::UnaryModule("Net") { inner = child("inner", std::make_shared<LogLayer>()); }
  Tensor forward(const Tensor& x) override { return (*inner)(x); }
  std::shared_ptr<LogLayer> inner;
};

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const anomaly::AnomalyError& e) {
    return e.what();
  }
  return "(no AnomalyError)";
}

void set_element(const Tensor& t, int64_t i, double v) {
  NoGradGuard ng;
  Tensor flat = raw::local_of(t).view({-1});
  flat.narrow(0, i, 1).fill_(v);
}

}  // namespace

TEST_CASE("anomaly: the op that produced a NaN is named, with its module, inputs and step", "[anomaly]") {
  auto net = nn::make_model<Net>();
  net->reset_parameters(1);
  Tensor x = uniform({3, 4}, 2, -1, 1);
  // Off: no check, the NaN flows on.
  CHECK(std::isnan(sum((*net)(x)).item<double>()));
  anomaly::Guard on;
  anomaly::set_step(7);
  const std::string m = message_of([&] { (*net)(x); });
  anomaly::set_step(-1);
  INFO(m);
  CHECK_THAT(m, Catch::Contains("step 7") && Catch::Contains("op 'log'") && Catch::Contains("module 'inner'") &&
                    Catch::Contains("NaN") && Catch::Contains("Tensor(float32, cpu, shape=[3, 4])") &&
                    Catch::Contains("every input was finite: this op produced it"));
  // Not a module call: no module named; an inf from finite inputs counts too.
  const std::string m2 = message_of([] { exp(tensor({1.0f, 100.0f}, {2})); });
  CHECK_THAT(m2, Catch::Contains("op 'exp'") && Catch::Contains("first inf at [1]") &&
                     !Catch::Contains("module"));
}

TEST_CASE("anomaly: a NaN that came in from outside any op is traced to the input that carried it", "[anomaly]") {
  Tensor x = uniform({2, 3}, 3, -1, 1);
  set_element(x, 4, kNaN);
  anomaly::Guard on;
  const std::string m = message_of([&] { sum(x * 2.0); });
  INFO(m);
  CHECK_THAT(m, Catch::Contains("op 'mul'") && Catch::Contains("already non-finite: 1 of 6 elements, first NaN at [1, 1]") &&
                    Catch::Contains("came in through the inputs"));
}

TEST_CASE("anomaly: a backward that produces an inf is named as <op>.bwd with its incoming gradients", "[anomaly]") {
  Tensor x = tensor({0.0f, 4.0f}, {2}).requires_grad_();
  Tensor y = sum(sqrt(x));  // finite forward; d sqrt(x)/dx = inf at 0
  anomaly::Guard on;
  const std::string m = message_of([&] { y.backward(); });
  INFO(m);
  CHECK_THAT(m, Catch::Contains("backward of op 'sqrt'") && Catch::Contains("first inf at [0]") &&
                    Catch::Contains("every incoming gradient was finite"));
}

TEST_CASE("anomaly: an optimizer state that went NaN is named with its parameter", "[anomaly]") {
  auto net = nn::make_model<Net>();
  net->reset_parameters(1);
  nn::AdamW opt(nn::default_param_groups(*net, 0.1), nn::AdamWOptions{});
  auto step = [&] {
    opt.zero_grad();
    Tensor x = uniform({3, 4}, 4, 1, 2);
    sum(net->inner->fc->forward(x) * net->inner->fc->forward(x)).backward();
    opt.step();
  };
  step();
  for (const auto& [name, t] : opt.state_dict())
    if (name == "inner.fc.weight.exp_avg_sq") set_element(t, 0, kNaN);
  anomaly::Guard on;
  const std::string m = message_of(step);
  INFO(m);
  CHECK_THAT(m, Catch::Contains("AdamW.step made parameter 'inner.fc.weight'") &&
                    Catch::Contains("exp_avg_sq: 1 non-finite elements") && Catch::Contains("gradient: finite"));
}

TEST_CASE("anomaly: on a dp x tp mesh every rank names the op fed by a NaN parameter", "[anomaly][dist]") {
  const auto reports = on_ranks(4, [](int) {
    RankReport rep;
    MlpConfig c;
    c.dropout = 0;
    auto model = nn::make_model<MlpClassifier>(c);
    model->reset_parameters(3);
    RunOptions o;
    o.detect_anomaly = true;
    auto run = parallelize(model, Mesh::world({{"dp", 2}, {"tp", 2}}), mlp_plan(), adamw({1e-2}), o);
    auto [x, y] = mlp_batch(c, 8, 3, 0);
    set_element(run.model().blocks[0]->fc1->weight, 0, kNaN);  // this rank's piece of it
    const std::string m = message_of([&] { run.model().loss(run.input(x), run.input(y)).backward(); });
    rep.expect(m.find("step 1, rank ") != std::string::npos, "no step/rank in: " + m);
    rep.expect(m.find("placements=") != std::string::npos, "no placements in: " + m);
    rep.expect(m.find("came in through the inputs") != std::string::npos, "not traced to its input: " + m);
    return rep.str();
  });
  CHECK(first_failure(reports) == "");
}

TEST_CASE("run: a non-finite gradient norm stops the step before the update (stop_on_nonfinite)", "[anomaly][run]") {
  MlpConfig c;
  c.dropout = 0;
  for (bool stop : {true, false}) {
    auto model = nn::make_model<MlpClassifier>(c);
    model->reset_parameters(3);
    RunOptions o;
    o.stop_on_nonfinite = stop;
    auto run = parallelize(model, adamw({1e-2}), o);
    auto [x, y] = mlp_batch(c, 8, 3, 0);
    run.forward_backward(x, y);
    run.step_optimizer();
    set_element(run.model().head->weight, 2, kNaN);
    const Tensor before = run.model().embed->weight.clone();
    run.forward_backward(x, y);
    if (stop) {
      CHECK_THROWS_WITH(run.step_optimizer(), Catch::Contains("step 2") && Catch::Contains("gradient norm is nan") &&
                                                  Catch::Contains("loss was nan") &&
                                                  Catch::Contains("--detect-anomaly"));
      CHECK(bitwise_equal(run.model().embed->weight, before));  // no update
    } else {
      CHECK(std::isnan(run.step_optimizer().grad_norm));  // trains on
    }
  }
}

TEST_CASE("train --detect-anomaly names the overflowing update, and its dump records it for tessel verify",
          "[anomaly][train]") {
  const fs::path dir = fs::path(scratch_dir("anomaly")) / "overflow";
  train::TrainConfig c;
  c.model_config = "tiny";
  c.steps = 3;
  c.batch_size = 4;
  c.seq_len = 16;
  c.eval_every = 0;
  c.eval_batches = 1;
  c.sample_length = 0;
  c.warmup_steps = 0;
  c.lr = 1e39;  // rounds to inf in float32: the first update overflows
  c.min_lr = 0;
  c.grad_clip = 0;
  c.out_dir = (dir / "plain").string();
  // Default: training stops at the first non-finite gradient norm.
  CHECK_THROWS_WITH(train::run_training(c, {nullptr, true}), Catch::Contains("gradient norm is"));
  c.out_dir = (dir / "anomaly").string();
  c.detect_anomaly = true;
  c.dump = (dir / "anomaly.dump").string();
  fs::create_directories(dir);
  std::string m;
  try {
    train::run_training(c, {nullptr, true});
  } catch (const anomaly::AnomalyError& e) {
    m = e.what();
  }
  INFO(m);
  CHECK_THAT(m, Catch::Contains("step 1") && Catch::Contains("AdamW.step made parameter") &&
                    Catch::Contains("the update itself overflowed"));
  const std::optional<std::string> v = train::first_divergence(c.dump, c.dump);
  REQUIRE(v.has_value());
  CHECK_THAT(*v, Catch::Contains("stopped at step 1 on an anomaly") && Catch::Contains("AdamW.step"));
}

TEST_CASE("out of memory names the op, the bytes asked for, and the allocator's use and limit", "[oom]") {
  Allocator* cpu = cpu_allocator();
  Tensor a = uniform({256, 256}, 5, -1, 1).requires_grad_();
  Tensor b = uniform({256, 4096}, 6, -1, 1);
  cpu->empty_cache();  // no cached block may serve the request
  cpu->set_limit(cpu->stats().current_bytes + (int64_t(1) << 20));  // 1 MiB more than tensors hold now
  std::string fwd, bwd;
  try {
    matmul(a, b);  // its output is 4 MiB
  } catch (const OutOfMemoryError& e) {
    fwd = e.what();
  } catch (const Error& e) {
    fwd = std::string("another error: ") + e.what();
  }
  Tensor y = sum(a * 2.0);
  cpu->set_limit(0);
  cpu->empty_cache();
  cpu->set_limit(cpu->stats().current_bytes + 256);  // the backward's first gradient does not fit
  try {
    y.backward();
  } catch (const OutOfMemoryError& e) {
    bwd = e.what();
  }
  cpu->set_limit(0);
  INFO(fwd);
  CHECK_THAT(fwd, Catch::Contains("out of memory in op 'matmul' on cpu: asked for 4.00 MiB (4194304 bytes)") &&
                      Catch::Contains("limit") && Catch::Contains("peak") && Catch::Contains("Run::memory()"));
  INFO(bwd);
  CHECK_THAT(bwd, Catch::Contains("in op 'mul' during 'mul.bwd'"));
  CHECK_THROWS_WITH(cpu->set_limit(-1), Catch::Contains("set_limit"));
  // With the limit gone, the same work runs.
  CHECK(matmul(a, uniform({256, 8}, 6, -1, 1)).shape() == Dims{256, 8});
}

TEST_CASE("parse_bytes reads byte counts with suffixes and names bad ones", "[oom]") {
  CHECK(parse_bytes("1024", "x") == 1024);
  CHECK(parse_bytes("512M", "x") == (int64_t(512) << 20));
  CHECK(parse_bytes("2G", "x") == (int64_t(2) << 30));
  CHECK(parse_bytes("1.5k", "x") == 1536);
  CHECK(parse_bytes("3GB", "x") == (int64_t(3) << 30));
  CHECK_THROWS_WITH(parse_bytes("lots", "TESSEL_CPU_MEMORY_LIMIT"),
                    Catch::Contains("TESSEL_CPU_MEMORY_LIMIT") && Catch::Contains("'lots'"));
  CHECK_THROWS_WITH(parse_bytes("5X", "x"), Catch::Contains("'5X'"));
  CHECK_THROWS_WITH(parse_bytes("-1", "x"), Catch::Contains("'-1'"));
}

TEST_CASE("grad_norm and clip_grad_norm_ report a NaN or inf gradient (a NaN sum was once dropped)", "[anomaly][clip]") {
  Tensor p = uniform({4}, 8, -1, 1).requires_grad_(), q = uniform({3}, 9, -1, 1).requires_grad_();
  for (double bad : {kNaN, double(INFINITY)}) {
    p.set_grad(tensor({1.0f, 2.0f, float(bad), 0.0f}, {4}));
    q.set_grad(tensor({1.0f, 1.0f, 1.0f}, {3}));
    const double n = nn::grad_norm({p, q});
    CHECK_FALSE(std::isfinite(n));
    CHECK_FALSE(std::isfinite(nn::clip_grad_norm_({p, q}, 1.0)));
    CHECK_THROWS_WITH(nn::clip_grad_norm_({p, q}, 1.0, /*error_if_nonfinite=*/true), Catch::Contains("error_if_nonfinite"));
  }
}
