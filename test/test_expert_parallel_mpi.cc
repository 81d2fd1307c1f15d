// Expert parallelism on the MPI backend (ranks as processes, under
// `mpirun -np 4` via test/mpi_test.sh): the all_to_all_v op, the MoE cases
// of test_expert_parallel on ep=4, dp2 x ep2 and ep2 x tp2, and a few
// Mixtral training steps on dp2 x ep2 against one device.
#include <catch2/catch.hpp>

#include <filesystem>

#include "autograd/api.h"
#include "runtime/comm/comm.h"
#include "test/ep/cases.h"
#include "test/util/dist.h"
#include "test/util/runfiles.h"
#include "test/util/util.h"
#include "train/trainer/trainer.h"

using namespace tessel;
using namespace tessel::testing;

namespace {

int world_size() {
  comm::init_mpi();  // idempotent
  return comm::world()->size();
}

}  // namespace

TEST_CASE("expert parallel mpi: all_to_all_v and its reverse", "[ep][mpi]") {
  const int n = world_size();
  CHECK(all_to_all_case(comm::world()->rank(), n) == "");
}

TEST_CASE("expert parallel mpi: the MoE on ep4, dp2xep2, ep2xtp2 equals one device", "[ep][mpi]") {
  REQUIRE(world_size() == 4);
  const std::vector<EpLayout> layouts = {
      {{{"ep", 4}}, false, true}, {{{"dp", 2}, {"ep", 2}}, false, true}, {{{"ep", 2}, {"tp", 2}}, true, true}};
  for (const nn::MoEConfig& cfg : {moe_test_config(4, 2), moe_test_config(8, 1), moe_test_config(4, 2, 0.5)}) {
    const EpOutcome ref = ep_reference(cfg, {4, 6, 8});
    for (const EpLayout& l : layouts) {
      INFO(mesh_name(l.mesh) << ", " << cfg.num_experts << " experts, top-" << cfg.top_k << ", capacity factor "
                             << cfg.capacity_factor);
      CHECK(ep_case(cfg, {4, 6, 8}, l, ref) == "");
    }
  }
}

TEST_CASE("expert parallel mpi: Mixtral trains on dp2xep2 like one device", "[ep][mpi][train]") {
  REQUIRE(world_size() == 4);
  train::TrainConfig c;
  c.model = "mixtral";
  c.steps = 5;
  c.batch_size = 8;
  c.seq_len = 16;
  c.micro_batches = 2;
  c.eval_every = 0;
  c.sample_length = 0;
  c.warmup_steps = 2;
  c.lr = 3e-3;
  c.out_dir = (std::filesystem::path(scratch_dir("ep_mpi")) / "run").string();
  auto losses = [](const train::TrainConfig& cfg) {
    std::vector<double> l;
    train::TrainHooks h;
    h.quiet = true;
    h.on_step = [&](const train::StepMetrics& m) { l.push_back(*m.loss); };
    train::run_training(cfg, h);
    return l;
  };
  const std::vector<double> ref = losses(c);  // every rank alone (no mesh)
  c.mesh = "dp=2,ep=2";
  const std::vector<double> got = losses(c);
  if (comm::world()->rank() == 0) {  // the hooks run on rank 0
    REQUIRE(got.size() == ref.size());
    for (size_t i = 0; i < ref.size(); ++i) CHECK(got[i] == Approx(ref[i]).epsilon(2e-5));
  }
}
