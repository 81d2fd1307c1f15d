#pragma once
// bench collectives: tessel's MPI backend (deterministic tree reductions over
// non-blocking MPI) against the raw MPI calls it replaces, in the same run:
//   all_reduce(sum)      vs MPI_Allreduce
//   all_gather           vs MPI_Allgather
//   reduce_scatter(sum)  vs MPI_Reduce_scatter_block
// float32, sizes 1 KiB .. 64 MiB (x4 steps), interleaved runs, median time
// (each run's time is the slowest rank's), bus bandwidth as nccl-tests
// defines it: algbw = S / t with S the full buffer (all_reduce: the tensor;
// all_gather: the output; reduce_scatter: the input), busbw = algbw * 2(n-1)/n
// for all_reduce and algbw * (n-1)/n for the other two.
//
// Rank 0 prints a table and ends with one JSON line:
//   {"bench": "collectives", "ours_s": .., "reference": "raw MPI (OpenMPI x.y)",
//    "reference_s": .., "speedup": reference_s / ours_s, "ranks": .., ...}
// ours_s / reference_s sum the median times of the three ops over the large
// sizes (>= 1 MiB; over every size run when none is large, e.g. --quick).
#include <cstdint>
#include <iosfwd>
#include <string>

namespace tessel::tools {

struct CollectivesBenchOptions {
  int reps = 7;              // timed runs per (op, size, implementation); median reported
  int warmup = 2;            // untimed runs first
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = 64 << 20;
  bool quick = false;        // 1 KiB .. 1 MiB, fewer runs (smoke test)
  std::string ops = "all_reduce,all_gather,reduce_scatter";
};

// Runs under MPI (init_mpi must have succeeded); every rank calls it. Writes
// the table and the JSON line to `out` on rank 0. Returns 0, or 1 when a
// result of ours differs from the reference's beyond rounding.
int run_collectives_bench(const CollectivesBenchOptions& opts, std::ostream& out);

}  // namespace tessel::tools
