// Bitwise resume across layouts (issue 7; docs/checkpoint.md "What a resume
// restores"): with cfg.bitwise, a run checkpointed on one layout and resumed
// on another continues with the one-device run's bits — loss bits and
// param_hash at every step, dropout on. The data-parallel strategies
// (ZeRO-1/2, FSDP), pipelines (a pp mesh dim: each stage saves and loads
// the parameters it holds) and expert parallelism (Mixtral, ep) save and
// resume the same way.
#include <catch2/catch.hpp>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/manager.h"
#include "test/util/runfiles.h"
#include "train/config.h"
#include "test/train/trace.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::train;
namespace fs = std::filesystem;

namespace {

TrainConfig base(const std::string& out, const std::string& model = "nanogpt") {
  TrainConfig c = testing::tiny_run(model, out);
  c.dropout = 0.1;
  c.seed = 11;
  c.bitwise = true;
  c.keep_last = 0;
  c.ckpt_sync = false;  // the background writer, as the trainer runs by default
  return c;
}

using testing::first_difference;
using Trace = testing::StepTrace;
Trace run(const TrainConfig& c) { return testing::run_traced(c); }

struct Layout {
  std::string mesh;
  bool sp = false;
  int zero = 0;
  std::string str() const {
    return (mesh.empty() ? std::string("one device") : mesh) + (sp ? " + sp" : "") +
           (zero ? " zero=" + std::to_string(zero) : "");
  }
};

TrainConfig on(TrainConfig c, const Layout& l) {
  c.mesh = l.mesh;
  c.sequence_parallel = l.sp;
  c.zero = l.zero;
  return c;
}

// Trains 20 steps on `saved` with a checkpoint every 10; checks steps 1..20
// against `ref`; returns the step-10 checkpoint.
std::string save_run(const std::string& root, const Layout& saved, const Trace& ref,
                     const std::string& model = "nanogpt") {
  TrainConfig c = on(base(root + "/saved", model), saved);
  c.ckpt_every = 10;
  const Trace t = run(c);
  INFO("saving run on " << saved.str());
  CHECK(first_difference(ref, t, 0) == "");
  const std::string ckpt = checkpoint::step_dir(c.checkpoint_root(), 10);
  REQUIRE(fs::exists(ckpt + "/metadata.json"));
  return ckpt;
}

// Resumes from `ckpt` (copied into a fresh run folder) on `resumed`; the
// steps 11..20 must be the reference's.
std::string resume_run(const std::string& root, const std::string& ckpt, const Layout& resumed, const Trace& ref,
                       const std::string& model = "nanogpt") {
  TrainConfig c = on(base(root, model), resumed);
  c.resume = true;
  fs::create_directories(c.checkpoint_root());
  fs::copy(ckpt, checkpoint::step_dir(c.checkpoint_root(), 10), fs::copy_options::recursive);
  try {
    return first_difference(ref, run(c), 10);
  } catch (const std::exception& e) {
    return std::string("threw: ") + e.what();
  }
}

}  // namespace

TEST_CASE("bitwise: a checkpoint saved on dp=2 resumes on tp=2 + sp and on one device with the one-device bits",
          "[checkpoint][bitwise]") {
  const std::string root = testing::scratch_dir("ckpt_bitwise");
  const Trace ref = run(base(root + "/ref"));
  REQUIRE(ref.steps.size() == 20);
  const std::string ckpt = save_run(root + "/dp2", {"dp=2"}, ref);
  const std::vector<Layout> resumed = {{"tp=2", true}, {""}, {"dp=2,tp=2", true}};
  for (size_t i = 0; i < resumed.size(); ++i) {
    INFO("saved on dp=2, resumed on " << resumed[i].str());
    CHECK(resume_run(root + "/dp2_to_" + std::to_string(i), ckpt, resumed[i], ref) == "");
  }
}

TEST_CASE("bitwise: checkpoints with ZeRO-1/2 and FSDP save and resume on other layouts with the one-device bits",
          "[checkpoint][bitwise]") {
  const std::string root = testing::scratch_dir("ckpt_bitwise_zero");
  const Trace ref = run(base(root + "/ref"));
  REQUIRE(ref.steps.size() == 20);
  // One device -> ZeRO-k, and ZeRO-k -> one device / DDP.
  const std::string one = save_run(root + "/one", {""}, ref);
  for (int zero : {1, 2, 3}) {
    const std::string tag = "zero" + std::to_string(zero);
    INFO("ZeRO stage " << zero);
    CHECK(resume_run(root + "/one_to_" + tag, one, {"dp=2", false, zero}, ref) == "");
    const std::string ck = save_run(root + "/" + tag, {"dp=2", false, zero}, ref);
    CHECK(resume_run(root + "/" + tag + "_to_one", ck, {""}, ref) == "");
    CHECK(resume_run(root + "/" + tag + "_to_tp", ck, {"tp=2", true}, ref) == "");
  }
}

TEST_CASE("bitwise: checkpoints of a pipelined run (pp mesh dim) resume on one device and back with the one-device bits",
          "[checkpoint][bitwise]") {
  const std::string root = testing::scratch_dir("ckpt_bitwise_pp");
  const Trace ref = run(base(root + "/ref"));
  REQUIRE(ref.steps.size() == 20);
  const std::string pp = save_run(root + "/pp2", {"pp=2"}, ref);
  CHECK(resume_run(root + "/pp2_to_one", pp, {""}, ref) == "");
  CHECK(resume_run(root + "/pp2_to_dp2", pp, {"dp=2"}, ref) == "");
  const std::string one = save_run(root + "/one", {""}, ref);
  CHECK(resume_run(root + "/one_to_pp2", one, {"pp=2"}, ref) == "");
  CHECK(resume_run(root + "/one_to_dp2pp2", one, {"dp=2,pp=2"}, ref) == "");
  // dp x pp: stages replicated over dp (chunks written once), resumed with tensor parallelism.
  const std::string dppp = save_run(root + "/dp2pp2", {"dp=2,pp=2"}, ref);
  CHECK(resume_run(root + "/dp2pp2_to_tp2", dppp, {"tp=2", true}, ref) == "");
  CHECK(resume_run(root + "/dp2pp2_to_tp2pp2", dppp, {"tp=2,pp=2", true}, ref) == "");
}

TEST_CASE("bitwise: a checkpoint saved on cp=2 (context parallel) resumes on one device, dp=2 and dp=2 x cp=2 with the one-device bits",
          "[checkpoint][bitwise][cp]") {
  const std::string root = testing::scratch_dir("ckpt_bitwise_cp");
  const Trace ref = run(base(root + "/ref"));
  REQUIRE(ref.steps.size() == 20);
  const std::string cp = save_run(root + "/cp2", {"cp=2"}, ref);
  CHECK(resume_run(root + "/cp2_to_one", cp, {""}, ref) == "");
  CHECK(resume_run(root + "/cp2_to_dp2", cp, {"dp=2"}, ref) == "");
  const std::string one = save_run(root + "/one", {""}, ref);
  CHECK(resume_run(root + "/one_to_dp2cp2", one, {"dp=2,cp=2"}, ref) == "");
}

TEST_CASE("bitwise: Mixtral checkpoints with expert parallelism (ep) resume on other layouts with the one-device bits",
          "[checkpoint][bitwise]") {
  const std::string root = testing::scratch_dir("ckpt_bitwise_ep");
  const Trace ref = run(base(root + "/ref", "mixtral"));
  REQUIRE(ref.steps.size() == 20);
  const std::string ep = save_run(root + "/ep2", {"ep=2"}, ref, "mixtral");
  CHECK(resume_run(root + "/ep2_to_one", ep, {""}, ref, "mixtral") == "");
  CHECK(resume_run(root + "/ep2_to_dp2ep2", ep, {"dp=2,ep=2"}, ref, "mixtral") == "");
  const std::string one = save_run(root + "/one", {""}, ref, "mixtral");
  CHECK(resume_run(root + "/one_to_ep2", one, {"ep=2"}, ref, "mixtral") == "");
  CHECK(resume_run(root + "/one_to_tp2", one, {"tp=2"}, ref, "mixtral") == "");
}
