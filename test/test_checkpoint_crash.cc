// Crash safety: a process SIGKILLed at any stage of a save (mid-file, after
// its data, after its checksums, after metadata.json, after the rename)
// leaves the previous checkpoint loadable; the new one is either absent or
// complete, never half there.
#include <catch2/catch.hpp>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "autograd/api.h"
#include "checkpoint/load.h"
#include "checkpoint/manager.h"
#include "test/checkpoint/layouts.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"

using namespace tessel;
using namespace tessel::checkpoint;
namespace fs = std::filesystem;

namespace {

std::string helper_path() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  if (srcdir && ws) return std::string(srcdir) + "/" + ws + "/test/ckpt_crash_helper";
  return "bazel-bin/test/ckpt_crash_helper";
}

// Runs the helper until it prints `stage`, then SIGKILLs it. Returns the lines it printed.
std::string run_and_kill(const std::string& root, const std::string& stage, bool async) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  const std::string helper = helper_path();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    dup2(fds[1], STDOUT_FILENO);
    close(fds[0]);
    close(fds[1]);
    execl(helper.c_str(), helper.c_str(), root.c_str(), stage.c_str(), async ? "async" : "sync", (char*)nullptr);
    _exit(127);
  }
  close(fds[1]);
  FILE* out = fdopen(fds[0], "r");
  std::string seen;
  char line[256];
  while (std::fgets(line, sizeof line, out)) {
    seen += line;
    if (seen.find(stage + "\n") != std::string::npos) break;
  }
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  std::fclose(out);
  return seen;
}

NamedTensors load_single(const std::string& dir, int64_t* step) {
  NamedTensors t = testing::lay_out(testing::ckpt_layout("single"), testing::ckpt_tensors(), true);
  *step = load(dir, t).state.at("step").get<int64_t>();
  return t;
}

}  // namespace

TEST_CASE("SIGKILL during a save leaves the previous checkpoint intact", "[checkpoint]") {
  const NamedTensors globals = testing::ckpt_tensors();
  for (const bool async : {false, true}) {
    for (const std::string stage : {"writing", "data", "manifest", "metadata", "committed"}) {
      INFO("killed at " << stage << (async ? " (async)" : ""));
      const std::string root = testing::scratch_dir("ckpt_crash_" + stage + (async ? "_async" : ""));
      const std::string seen = run_and_kill(root, stage, async);
      REQUIRE(seen.find("saved 1\n") != std::string::npos);
      REQUIRE(seen.find(stage + "\n") != std::string::npos);  // it died at that stage, not after
      const auto latest = latest_checkpoint(root);
      REQUIRE(latest.has_value());
      int64_t step = 0;
      NamedTensors got = load_single(latest->path, &step);
      if (stage == "committed") {
        CHECK(latest->step == 2);  // the rename happened: the new one is complete
        CHECK(step == 2);
      } else {
        CHECK(latest->step == 1);
        CHECK(step == 1);
        CHECK(fs::exists(step_dir(root, 2) + ".tmp"));
        CHECK(!fs::exists(step_dir(root, 2)));
        for (size_t i = 0; i < globals.size(); ++i) CHECK(testing::bitwise_equal(got[i].second, globals[i].second));
      }
      CheckpointReader r(latest->path);
      CHECK_NOTHROW(r.verify_all());
      // The next run cleans up what the crash left.
      prune_checkpoints(root, 0);
      CHECK(!fs::exists(step_dir(root, 2) + ".tmp"));
    }
  }
}
