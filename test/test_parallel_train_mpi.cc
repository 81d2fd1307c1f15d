// nD-parallel training under mpirun -np 4 (MPI backend, ranks as processes):
// 10 steps of NanoGPT (dropout on) and LLaMA on dp2 x tp2 (+ sequence
// parallel) give the single-device losses and parameters within float
// tolerance. (Each rank also runs the single-device reference itself.)
#include <catch2/catch.hpp>

#include <filesystem>

#include "autograd/api.h"
#include "runtime/comm/comm.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::train;

namespace {

struct Run {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;
  CompileStats compile;
};

Run run(const std::string& model, const std::string& mesh, bool sp, bool compile = false, int zero = 0) {
  comm::init_mpi();
  TrainConfig c;
  c.model = model;
  c.model_config = "tiny";
  c.steps = 10;
  c.batch_size = 8;
  c.seq_len = 16;
  c.micro_batches = 2;
  c.eval_every = 0;
  c.sample_length = 0;
  c.lr = 3e-3;
  c.dropout = model == "nanogpt" ? 0.1 : -1;
  c.mesh = mesh;
  c.sequence_parallel = sp;
  c.compile = compile;
  c.zero = zero;
  // One scratch folder per rank (scratch_dir empties it; only rank 0 writes into it).
  const std::string dir = testing::scratch_dir("parallel_mpi_" + std::to_string(comm::world()->rank()));
  c.out_dir = (std::filesystem::path(dir) / (model + mesh + (compile ? "-compiled" : ""))).string();
  Run r;
  TrainHooks h;
  h.quiet = true;
  h.keep_params = true;
  h.on_step = [&](const StepMetrics& m) { r.losses.push_back(*m.loss); };
  TrainResult result = run_training(c, h);
  r.params = std::move(result.final_params);
  r.compile = result.compile;
  return r;
}

}  // namespace

TEST_CASE("mpi: dp2 x tp2 (+sp) training matches one device", "[parallel][mpi]") {
  for (std::string model : {"nanogpt", "llama"}) {
    const Run ref = run(model, "", false);
    for (bool sp : {false, true}) {
      const Run got = run(model, "dp=2,tp=2", sp);
      // Every rank checks its own copy; rank 0's hooks carry the metrics.
      if (comm::world()->rank() != 0) continue;
      INFO(model << (sp ? " + sp" : ""));
      REQUIRE(got.losses.size() == ref.losses.size());
      for (size_t i = 0; i < ref.losses.size(); ++i) CHECK(got.losses[i] == Approx(ref.losses[i]).epsilon(2e-5));
      REQUIRE(got.params.size() == ref.params.size());
      for (size_t i = 0; i < ref.params.size(); ++i)
        CHECK(testing::allclose(got.params[i].second, ref.params[i].second, 1e-4, 2e-5));
    }
  }
}

// Compile mode with ranks as processes (docs/compile.md): every rank replays
// its recorded step, MPI collectives included, from step 4 on, and gives
// the eager run's bits on the same layout (fast mode).
TEST_CASE("mpi: compile mode on dp2 x tp2 + sp (DDP, ZeRO-2, FSDP) and dp2 x pp2 replays with the eager bits",
          "[parallel][mpi][compile]") {
  struct Layout {
    const char* mesh;
    bool sp;
    int zero;
  };
  for (const Layout& l : {Layout{"dp=2,tp=2", true, 0}, Layout{"dp=2,tp=2", true, 2}, Layout{"dp=2,tp=2", true, 3},
                          Layout{"dp=2,pp=2", false, 0}}) {
    const Run eager = run("nanogpt", l.mesh, l.sp, false, l.zero);
    const Run compiled = run("nanogpt", l.mesh, l.sp, true, l.zero);
    // Every rank replayed (a rank that ran eagerly would still match the bits).
    INFO(l.mesh << " zero=" << l.zero << ", rank " << comm::world()->rank() << ": " << compiled.compile.refused);
    CHECK(compiled.compile.refused.empty());
    CHECK(compiled.compile.replays == 7);
    if (comm::world()->rank() != 0) continue;
    REQUIRE(compiled.losses.size() == eager.losses.size());
    for (size_t i = 0; i < eager.losses.size(); ++i) CHECK(compiled.losses[i] == eager.losses[i]);
    REQUIRE(compiled.params.size() == eager.params.size());
    for (size_t i = 0; i < eager.params.size(); ++i)
      CHECK(testing::allclose(compiled.params[i].second, eager.params[i].second, 0.0, 0.0));
  }
}
