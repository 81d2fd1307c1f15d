// Pipeline parallelism on the MPI backend (ranks as processes, under
// `mpirun -np 4` via test/mpi_test.sh): NanoGPT (dropout, tied wte) on
// dp2 x pp2 with 1F1B and LLaMA on pp4 with GPipe train 10 steps like one
// device. Every process also trains the single-device reference itself;
// rank 0, which gathers the metrics and the final parameters, compares.
#include <catch2/catch.hpp>

#include <filesystem>

#include "autograd/api.h"
#include "runtime/comm/comm.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/config.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using tessel::train::TrainConfig;

namespace {

struct Run {
  std::vector<double> losses, grad_norms;
  std::vector<std::pair<std::string, Tensor>> params;
};

Run run(TrainConfig c) {
  Run r;
  train::TrainHooks h;
  h.quiet = true;
  h.keep_params = true;
  h.on_step = [&](const train::StepMetrics& m) {
    r.losses.push_back(*m.loss);
    r.grad_norms.push_back(*m.grad_norm);
  };
  r.params = train::run_training(c, h).final_params;
  return r;
}

TrainConfig base(const std::string& model) {
  TrainConfig c;
  c.model = model;
  c.model_config = "tiny";
  c.n_layer = 4;
  c.steps = 10;
  c.batch_size = 8;
  c.seq_len = 16;
  c.micro_batches = 4;
  c.eval_every = 0;
  c.eval_batches = 1;
  c.sample_length = 0;
  c.lr = 3e-3;
  c.warmup_steps = 3;
  c.min_lr = 3e-4;
  c.dropout = model == "nanogpt" ? 0.1 : -1;
  // One folder per process: scratch_dir empties it, and every process writes its reference run.
  const std::string dir = "pipeline_mpi_rank" + std::to_string(comm::world()->rank());
  c.out_dir = (std::filesystem::path(tessel::testing::scratch_dir(dir)) / model).string();
  return c;
}

}  // namespace

TEST_CASE("pipeline mpi: dp2 x pp2 and pp4 train like one device", "[pipeline][mpi]") {
  comm::init_mpi();
  REQUIRE(comm::world()->size() == 4);
  const bool rank0 = comm::world()->rank() == 0;
  struct Case {
    const char* model;
    const char* mesh;
    const char* schedule;
  };
  for (Case k : {Case{"nanogpt", "dp=2,pp=2", "1f1b"}, Case{"llama", "pp=4", "gpipe"}}) {
    INFO(k.model << " on " << k.mesh << " " << k.schedule);
    const Run ref = run(base(k.model));  // no mesh: this process alone
    TrainConfig c = base(k.model);
    c.mesh = k.mesh;
    c.pipeline_schedule = k.schedule;
    const Run got = run(c);
    if (!rank0) continue;  // the others have no metrics hooks and no gathered parameters
    REQUIRE(got.losses.size() == ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i) {
      CHECK(got.losses[i] == Approx(ref.losses[i]).epsilon(2e-5));
      CHECK(got.grad_norms[i] == Approx(ref.grad_norms[i]).epsilon(1e-4));
    }
    REQUIRE(got.params.size() == ref.params.size());
    for (size_t i = 0; i < ref.params.size(); ++i) {
      INFO(ref.params[i].first);
      CHECK(testing::allclose(got.params[i].second, ref.params[i].second, 1e-4, 2e-5));
      if (std::string(k.model) == "llama") CHECK(testing::bitwise_equal(got.params[i].second, ref.params[i].second));
    }
  }
}
