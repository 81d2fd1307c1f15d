#pragma once
// tessel::launch: run a function on every rank of a job, the same way
// whether the ranks are threads of this process or MPI processes.
//
//   int main() {
//     numerics::BitwiseGuard bitwise(true);   // optional: reaches every rank
//     tessel::launch(4, [](int rank) {
//       MeshPtr mesh = Mesh::world({{"dp", 2}, {"tp", 2}});
//       ...
//     });
//   }
//
//   ./my_program                      # 4 ranks as threads (comm::run_local)
//   mpirun -np 4 ./my_program         # 4 processes, one rank each
#include <functional>

namespace tessel {

// Runs fn(rank) on each of `ranks` ranks and returns when all are done
// (rethrowing the first rank's error):
//  - inside a job already (a caller's run_local, or MPI initialised): fn on
//    this thread, as this rank (the world must have `ranks` ranks);
//  - started by mpirun/srun: initialises MPI; this process is one rank;
//  - otherwise: `ranks` threads of this process, each with the caller's
//    numerics settings (ranks == 1: fn(0) on this thread, no backend).
// A world size that differs from `ranks` is an error naming both.
void launch(int ranks, const std::function<void(int rank)>& fn);

}  // namespace tessel
