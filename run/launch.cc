#include "run/launch.h"

#include "runtime/comm/comm.h"
#include "runtime/error.h"

namespace tessel {

void launch(int ranks, const std::function<void(int rank)>& fn) {
  TESSEL_CHECK(ranks >= 1, "tessel::launch", "needs at least one rank, got {}", ranks);
  if (!comm::has_world() && comm::is_mpi_launch()) comm::init_mpi();
  if (comm::has_world()) {
    const int world = comm::world()->size();
    TESSEL_CHECK(world == ranks, "tessel::launch",
                 "asked for {} ranks but this job has {} ({} backend): launch it with as many ranks as the mesh has "
                 "devices (mpirun -np {})",
                 ranks, world, comm::world()->backend(), ranks);
    fn(comm::world()->rank());
    return;
  }
  if (ranks == 1) {
    fn(0);
    return;
  }
  comm::run_local(ranks, fn);
}

}  // namespace tessel
