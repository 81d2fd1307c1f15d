// Resume: a `tessel train` process killed with SIGKILL, resumed from its last
// checkpoint, continues with the metrics (loss bits, param_hash) of an
// uninterrupted run. Same layout: bit for bit (dropout on: the RNG needs
// nothing but (seed, step)). Another layout: within float tolerance, and
// with --bitwise bit for bit the one-device run's (test_checkpoint_bitwise
// covers more layouts in-process). Also: the metrics file is continued,
// checkpoints are pruned to keep_last, wrong seeds are refused.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "checkpoint/load.h"
#include "checkpoint/manager.h"
#include "test/util/runfiles.h"
#include "train/config.h"
#include "train/metrics.h"
#include "test/train/trace.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::train;
namespace fs = std::filesystem;

namespace {

TrainConfig resume_config(const std::string& out, const std::string& mesh) {
  TrainConfig c = testing::tiny_run("nanogpt", out);
  c.dropout = 0.1;  // exercises the RNG across the resume
  c.steps = 40;
  c.seq_len = 32;
  c.seed = 7;
  c.ckpt_every = 4;
  c.keep_last = 2;
  c.mesh = mesh;
  return c;
}

std::string tessel_binary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  if (srcdir && ws) return std::string(srcdir) + "/" + ws + "/tools/tessel";
  return "bazel-bin/tools/tessel";
}

// Starts `tessel train` with c's settings, SIGKILLs it as soon as a
// checkpoint after `kill_after` steps is complete. Returns the newest step saved.
int64_t train_and_kill(const TrainConfig& c, int64_t kill_after) {
  std::vector<std::string> args = {tessel_binary(), "train", "--model", c.model, "--config", c.model_config,
                                   "--dropout", std::to_string(c.dropout), "--steps", std::to_string(c.steps),
                                   "--batch-size", std::to_string(c.batch_size), "--seq-len",
                                   std::to_string(c.seq_len), "--micro-batches", std::to_string(c.micro_batches),
                                   "--eval-every", "0", "--sample-length", "0", "--lr", "0.003", "--min-lr", "0.0003",
                                   "--warmup-steps", std::to_string(c.warmup_steps), "--seed",
                                   std::to_string(c.seed), "--ckpt-every", std::to_string(c.ckpt_every),
                                   "--keep-last", std::to_string(c.keep_last), "--out", c.out_dir};
  if (c.bitwise) args.push_back("--bitwise");
  if (!c.mesh.empty()) {
    args.push_back("--mesh");
    args.push_back(c.mesh);
  }
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    if (!freopen("/dev/null", "w", stdout)) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  const std::string root = c.checkpoint_root();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(240);
  for (;;) {
    auto latest = checkpoint::latest_checkpoint(root);
    if (latest && latest->step >= kill_after) break;
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) FAIL("tessel train exited before it could be killed");
    if (std::chrono::steady_clock::now() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  CHECK(WIFSIGNALED(status));
  auto latest = checkpoint::latest_checkpoint(root);
  REQUIRE(latest.has_value());
  return latest->step;
}

std::vector<StepMetrics> uninterrupted(const TrainConfig& c) {
  TrainConfig u = c;
  u.ckpt_every = 0;
  run_training(u, {nullptr, /*quiet=*/true});
  return read_metrics(u.metrics_path());
}

}  // namespace

TEST_CASE("kill -9 a training run, resume: the remaining steps repeat an uninterrupted run", "[checkpoint]") {
  const std::string root = testing::scratch_dir("ckpt_resume");
  struct Case {
    std::string killed_mesh, resumed_mesh;
    bool bitwise;            // the remaining steps compare bit for bit
    bool bitwise_mode = false;  // --bitwise: the reference is the one-device run, any layouts
  };
  for (const Case& k : {Case{"", "", true}, Case{"dp=2", "dp=2", true}, Case{"dp=2", "tp=2", false},
                        Case{"tp=2", "", false}, Case{"dp=2", "tp=2", true, true}}) {
    INFO("killed on '" << k.killed_mesh << "', resumed on '" << k.resumed_mesh << "'"
                       << (k.bitwise_mode ? " (--bitwise)" : ""));
    const std::string tag = k.killed_mesh + "_" + k.resumed_mesh + (k.bitwise_mode ? "_bitwise" : "");
    TrainConfig c = resume_config(root + "/run" + tag, k.killed_mesh);
    c.bitwise = k.bitwise_mode;
    TrainConfig ref = resume_config(root + "/ref" + tag, k.bitwise_mode ? "" : k.resumed_mesh);
    ref.bitwise = k.bitwise_mode;
    const std::vector<StepMetrics> want = uninterrupted(ref);
    const int64_t saved = train_and_kill(c, 8);
    INFO("resumed after step " << saved);
    REQUIRE(saved < c.steps);  // it really was interrupted

    TrainConfig r = c;
    r.resume = true;
    r.mesh = k.resumed_mesh;
    run_training(r, {nullptr, true});
    const std::vector<StepMetrics> got = read_metrics(c.metrics_path());
    REQUIRE(got.size() == want.size());  // the killed run's lines up to the checkpoint, then the resumed ones
    for (size_t i = size_t(saved); i < want.size(); ++i) {
      INFO("step " << want[i].step);
      REQUIRE(got[i].step == want[i].step);
      if (k.bitwise) {
        CHECK(*got[i].loss == *want[i].loss);
        CHECK(*got[i].grad_norm == *want[i].grad_norm);
        CHECK(got[i].param_hash == want[i].param_hash);
      } else {
        CHECK(*got[i].loss == Approx(*want[i].loss).epsilon(1e-4));
      }
    }
    // keep_last = 2 complete checkpoints, the last one the final step's.
    const auto all = checkpoint::list_checkpoints(c.checkpoint_root());
    REQUIRE(all.size() == 2);
    CHECK(all.back().step == c.steps);
    CHECK(!fs::exists(checkpoint::step_dir(c.checkpoint_root(), saved + c.ckpt_every) + ".tmp"));
  }
}

TEST_CASE("resume refuses a checkpoint of another seed or model; no checkpoint starts fresh", "[checkpoint]") {
  const std::string root = testing::scratch_dir("ckpt_resume_bad");
  TrainConfig c = resume_config(root + "/a", "");
  c.steps = 4;
  c.ckpt_every = 2;
  c.ckpt_sync = true;
  const TrainResult done = run_training(c, {nullptr, true});
  // Resumed at its last step: nothing to train, and the result still names
  // the parameters (the checkpoint's), not an empty hash.
  TrainConfig again = c;
  again.resume = true;
  CHECK(run_training(again, {nullptr, true}).param_hash == done.param_hash);
  TrainConfig s = c;
  s.resume = true;
  s.seed = 8;
  CHECK_THROWS_WITH(run_training(s, {nullptr, true}), Catch::Contains("seed 7") && Catch::Contains("seed 8"));
  TrainConfig m = c;
  m.resume = true;
  m.model = "llama";
  CHECK_THROWS_WITH(run_training(m, {nullptr, true}),
                    Catch::Contains("nanogpt") &&
                        Catch::Contains("the run started with --model nanogpt --config " + c.model_config));
  TrainConfig fresh = resume_config(root + "/empty", "");
  fresh.steps = 2;
  fresh.resume = true;
  CHECK(run_training(fresh, {nullptr, true}).steps == 2);
}
