// Data-parallel strategies on the MPI backend (ranks as processes, under
// `mpirun -np 4` via test/mpi_test.sh): a few training steps of the tiny
// NanoGPT (dropout on, 2 micro-batches) with DDP and ZeRO-2 on dp=4 and FSDP
// on dp=2 x tp=2 give the losses and final parameters of one device (which
// every rank also trains, on its own). test_parallel_train covers every
// model and stage on the local backend.
#include <catch2/catch.hpp>

#include <string>

#include "runtime/comm/comm.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/config.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::train;

namespace {

struct Run {
  std::vector<double> losses;
  std::vector<std::pair<std::string, Tensor>> params;
};

Run run(TrainConfig c) {
  comm::init_mpi();  // idempotent
  // One folder per rank and run: scratch_dir empties it, so ranks must not share one.
  c.out_dir = testing::scratch_dir("dp_mpi_rank" + std::to_string(comm::world()->rank()) + "_" + c.mesh + "_" +
                                   std::to_string(c.zero));
  Run r;
  TrainHooks h;
  h.quiet = true;
  h.keep_params = true;
  h.on_step = [&](const StepMetrics& m) { r.losses.push_back(*m.loss); };
  r.params = run_training(c, h).final_params;
  return r;
}

TrainConfig base() {
  TrainConfig c;
  c.model = "nanogpt";
  c.model_config = "tiny";
  c.steps = 6;
  c.batch_size = 8;
  c.seq_len = 16;
  c.micro_batches = 2;
  c.eval_every = 0;
  c.sample_length = 0;
  c.lr = 3e-3;
  c.warmup_steps = 2;
  c.min_lr = 3e-4;
  c.dropout = 0.1;
  c.ddp_bucket_mb = 0.02;
  return c;
}

}  // namespace

TEST_CASE("data parallel mpi: DDP, ZeRO-2 and FSDP x tp train like one device", "[data_parallel][mpi]") {
  comm::init_mpi();
  REQUIRE(comm::world()->size() == 4);
  const Run ref = run(base());  // no mesh: this process alone
  struct Layout {
    const char* mesh;
    int zero;
  };
  for (Layout l : {Layout{"dp=4", 0}, Layout{"dp=4", 2}, Layout{"dp=2,tp=2", 3}}) {
    TrainConfig c = base();
    c.mesh = l.mesh;
    c.zero = l.zero;
    c.backend = "mpi";
    const Run got = run(c);
    INFO(l.mesh << " zero=" << l.zero);
    REQUIRE(got.losses.size() == ref.losses.size());
    for (size_t i = 0; i < ref.losses.size(); ++i) CHECK(got.losses[i] == Approx(ref.losses[i]).epsilon(2e-5));
    REQUIRE(got.params.size() == ref.params.size());
    for (size_t i = 0; i < ref.params.size(); ++i) {
      INFO(ref.params[i].first);
      CHECK(testing::allclose(got.params[i].second, ref.params[i].second, 1e-4, 2e-5));
    }
  }
}
