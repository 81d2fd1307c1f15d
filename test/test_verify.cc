// tessel verify and --dump (train/dump.h): metrics compared field by field
// (timings ignored), dumps matched by value; a bitwise tp=2 + sp run's trace
// matches the one-device run's, a fast-mode one is caught at its first
// row-parallel linear.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>

#include "test/util/runfiles.h"
#include "train/dump.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::train;

namespace {

const std::string& dir() {
  static const std::string d = testing::scratch_dir("verify");  // created (emptied) once
  return d;
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

TrainConfig tiny(const std::string& name) {
  TrainConfig c;
  c.model = "nanogpt";
  c.model_config = "tiny";
  c.steps = 2;
  c.batch_size = 8;
  c.seq_len = 16;
  c.eval_every = 0;
  c.sample_length = 0;
  c.dropout = 0.1;
  c.out_dir = dir() + "/" + name;
  c.dump = dir() + "/" + name + ".dump";
  return c;
}

}  // namespace

TEST_CASE("verify: metrics files, first differing step and field; timings ignored", "[verify]") {
  const std::string a = dir() + "/a.jsonl", b = dir() + "/b.jsonl", c = dir() + "/c.jsonl";
  write(a, "{\"step\":1,\"loss\":2.5,\"tokens_per_s\":10,\"param_hash\":\"aa\"}\n"
           "{\"step\":2,\"loss\":2.25,\"tokens_per_s\":11,\"param_hash\":\"bb\"}\n");
  write(b, "{\"step\":1,\"loss\":2.5,\"tokens_per_s\":99,\"param_hash\":\"aa\"}\n"
           "{\"step\":2,\"loss\":2.25,\"tokens_per_s\":98,\"param_hash\":\"bb\"}\n");
  write(c, "{\"step\":1,\"loss\":2.5,\"tokens_per_s\":10,\"param_hash\":\"aa\"}\n"
           "{\"step\":2,\"loss\":2.25,\"tokens_per_s\":11,\"param_hash\":\"bc\"}\n");
  CHECK_FALSE(first_divergence(a, b).has_value());
  const auto d = first_divergence(a, c);
  REQUIRE(d.has_value());
  CHECK_THAT(*d, Catch::Contains("step 2") && Catch::Contains("param_hash"));
  write(c, "{\"step\":1,\"loss\":2.5,\"tokens_per_s\":10,\"param_hash\":\"aa\"}\n");
  CHECK_THAT(*first_divergence(a, c), Catch::Contains("every step both have (1) agrees, but " + a + " alone has steps 2"));
  // A resumed run (steps 2 on) lines up by step, not by line.
  write(c, "{\"step\":2,\"loss\":2.25,\"tokens_per_s\":5,\"param_hash\":\"bb\"}\n");
  CHECK_THAT(*first_divergence(a, c), Catch::Contains("every step both have (2) agrees"));
  write(c, "{\"step\":2,\"loss\":2.5,\"tokens_per_s\":5,\"param_hash\":\"bb\"}\n");
  CHECK_THAT(*first_divergence(a, c), Catch::Contains("step 2") && Catch::Contains("loss 2.25 vs 2.5"));
  write(c, "{\"step\":7,\"loss\":2.5}\n");
  CHECK_THAT(*first_divergence(a, c), Catch::Contains("no step in common"));
  write(c, "");
  CHECK_THROWS_WITH(first_divergence(a, c), Catch::Contains("has no metrics rows"));
  CHECK_THROWS_WITH(first_divergence(a, dir() + "/missing.jsonl"), Catch::Contains("cannot open"));
}

TEST_CASE("verify --dump: bitwise tp=2 + sp matches one device op for op; fast mode is localised", "[verify]") {
  TrainConfig one = tiny("one");
  one.bitwise = true;
  TrainHooks quiet;
  quiet.quiet = true;
  run_training(one, quiet);
  TrainConfig tp = tiny("tp_bitwise");
  tp.bitwise = true;
  tp.mesh = "tp=2";
  tp.sequence_parallel = true;
  run_training(tp, quiet);
  TrainConfig fast = tiny("tp_fast");
  fast.mesh = "tp=2";
  fast.sequence_parallel = true;
  run_training(fast, quiet);

  CHECK_FALSE(first_divergence(one.dump, tp.dump).has_value());
  CHECK_FALSE(first_divergence(one.out_dir + "/metrics.jsonl", tp.out_dir + "/metrics.jsonl").has_value());
  const auto d = first_divergence(one.dump, fast.dump);
  REQUIRE(d.has_value());
  CHECK_THAT(*d, Catch::Contains("step 1, fwd") && Catch::Contains("linear"));
  CHECK(first_divergence(one.out_dir + "/metrics.jsonl", fast.out_dir + "/metrics.jsonl").has_value());
}

// Context parallelism: one sequence per step, so the pieces stay local in
// bitwise mode; a traced run takes contiguous pieces (autograd/ops/attention.cc).
TEST_CASE("verify --dump: bitwise cp=2 matches one device op for op", "[verify][cp]") {
  TrainHooks quiet;
  quiet.quiet = true;
  TrainConfig one = tiny("cp_one");
  one.bitwise = true;
  one.batch_size = 1;
  run_training(one, quiet);
  TrainConfig cp = tiny("cp2");
  cp.bitwise = true;
  cp.batch_size = 1;
  cp.mesh = "cp=2";
  run_training(cp, quiet);
  CHECK_FALSE(first_divergence(one.dump, cp.dump).has_value());
  CHECK_FALSE(first_divergence(one.out_dir + "/metrics.jsonl", cp.out_dir + "/metrics.jsonl").has_value());
}

TEST_CASE("--dump refuses a pipeline mesh", "[verify]") {
  TrainConfig c = tiny("pp");
  c.mesh = "pp=2";
  c.micro_batches = 2;
  TrainHooks quiet;
  quiet.quiet = true;
  CHECK_THROWS_WITH(run_training(c, quiet), Catch::Contains("--dump") && Catch::Contains("pp"));
}
