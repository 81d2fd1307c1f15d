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
};

Run run(const std::string& model, const std::string& mesh, bool sp) {
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
  // One scratch folder per rank (scratch_dir empties it; only rank 0 writes into it).
  const std::string dir = testing::scratch_dir("parallel_mpi_" + std::to_string(comm::world()->rank()));
  c.out_dir = (std::filesystem::path(dir) / (model + mesh)).string();
  Run r;
  TrainHooks h;
  h.quiet = true;
  h.keep_params = true;
  h.on_step = [&](const StepMetrics& m) { r.losses.push_back(*m.loss); };
  r.params = run_training(c, h).final_params;
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
