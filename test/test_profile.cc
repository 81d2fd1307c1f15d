// The per-op profiler (runtime/profile.h): self and total times nest, op
// calls and backward nodes are recorded under their names, nothing is
// recorded without a profiler, and `train --profile` returns the table.
#include <catch2/catch.hpp>

#include <chrono>
#include <filesystem>
#include <thread>

#include "autograd/api.h"
#include "runtime/profile.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/config.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::testing;

namespace {
const profile::Row* find(const std::vector<profile::Row>& rows, const std::string& name) {
  for (const auto& r : rows)
    if (r.name == name) return &r;
  return nullptr;
}
void sleep_ms(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }
}  // namespace

TEST_CASE("profiler: self time excludes nested timers, total includes them") {
  profile::Profiler p;
  {
    profile::Scope s(&p);
    profile::Timer outer("outer");
    sleep_ms(20);
    {
      profile::Timer inner("inner", ".x");
      sleep_ms(40);
    }
    {
      profile::Timer inner("inner", ".x");
      sleep_ms(40);
    }
  }
  const auto rows = p.rows();
  REQUIRE(rows.size() == 2);
  const profile::Row* o = find(rows, "outer");
  const profile::Row* i = find(rows, "inner.x");
  REQUIRE(o);
  REQUIRE(i);
  CHECK(rows[0].name == "inner.x");  // sorted by self time
  CHECK(o->calls == 1);
  CHECK(i->calls == 2);
  CHECK(i->self_s >= 0.079);
  CHECK(i->self_s == i->total_s);  // no children
  CHECK(o->total_s >= o->self_s + i->total_s - 1e-9);
  CHECK(o->self_s >= 0.019);
  CHECK(o->self_s < 0.060);  // the 80 ms of the inner timers are not the outer's own
  CHECK(p.self_total_s() == Approx(o->self_s + i->self_s));
  const std::string t = p.table();
  CHECK(t.find("inner.x") != std::string::npos);
  CHECK(t.find("profiled total") != std::string::npos);
  p.clear();
  CHECK(p.rows().empty());
}

TEST_CASE("profiler: op calls and backward nodes; off means nothing recorded") {
  Tensor a = uniform({32, 32}, 1).requires_grad_();
  {
    Tensor y = sum(matmul(a, a));  // no profiler installed: nothing to record, no crash
    y.backward();
  }
  CHECK(profile::current() == nullptr);
  profile::Profiler p;
  {
    profile::Scope s(&p);
    CHECK(profile::current() == &p);
    Tensor y = sum(matmul(a, a));
    y.backward();
  }
  CHECK(profile::current() == nullptr);  // the scope restored the previous (none)
  const auto rows = p.rows();
  for (const char* name : {"matmul", "sum", "matmul.bwd", "sum.bwd"}) {
    INFO(name);
    const profile::Row* r = find(rows, name);
    REQUIRE(r);
    CHECK(r->calls == 1);
    CHECK(r->self_s >= 0);
    CHECK(r->self_s <= r->total_s);
  }
}

TEST_CASE("train --profile: the per-op table of the steps") {
  train::TrainConfig c;
  c.model = "nanogpt";
  c.model_config = "tiny";
  c.steps = 2;
  c.batch_size = 4;
  c.seq_len = 16;
  c.eval_every = 0;
  c.eval_batches = 1;
  c.sample_length = 0;
  c.profile = true;
  c.out_dir = (std::filesystem::path(tessel::testing::scratch_dir("profile")) / "run").string();
  const train::TrainResult r = train::run_training(c, {nullptr, /*quiet=*/true});
  for (const char* name : {"matmul", "matmul.bwd", "optimizer.step", "clip_grad_norm", "profiled total"}) {
    INFO(name << "\n" << r.profile);
    CHECK(r.profile.find(name) != std::string::npos);
  }
  c.profile = false;
  c.out_dir += "2";
  CHECK(train::run_training(c, {nullptr, true}).profile.empty());
}
