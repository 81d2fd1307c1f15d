// bench_collectives: see tools/bench/collectives_bench.h.
//
// Started without a launcher (e.g. by `./tessel bench collectives`), it
// re-executes itself under `mpirun -np N` (N = --ranks, default 4) with the
// settings a single machine needs: shared-memory transport only, ranks may
// outnumber cores, and root allowed (containers).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>
#include <vector>

#include "runtime/comm/comm.h"
#include "runtime/error.h"
#include "tools/bench/collectives_bench.h"

namespace {

std::string self_path() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return buf;
}

int relaunch_under_mpirun(int ranks, int argc, char** argv) {
  std::vector<std::string> args = {"mpirun", "-np", std::to_string(ranks)};
  const unsigned cores = std::thread::hardware_concurrency();
  if (unsigned(ranks) > cores) {
    args.insert(args.end(), {"--oversubscribe", "--bind-to", "none"});
  }
  args.insert(args.end(), {"--mca", "btl", "self,vader", self_path()});
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  if (geteuid() == 0) {
    setenv("OMPI_ALLOW_RUN_AS_ROOT", "1", 1);
    setenv("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1", 1);
  }
  std::string cmd;
  for (const auto& a : args) cmd += (cmd.empty() ? "" : " ") + a;
  std::fprintf(stderr, "bench collectives: %s\n", cmd.c_str());
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  cargs.push_back(nullptr);
  execvp("mpirun", cargs.data());
  std::perror("bench collectives: cannot run mpirun (install openmpi-bin: tools/deps.sh)");
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  tessel::tools::CollectivesBenchOptions opts;
  int ranks = 4;
  int max_mib = 64;
  CLI::App app{"tessel collectives (mpi backend, deterministic reductions) vs raw MPI"};
  app.add_option("--ranks", ranks, "MPI ranks to launch when not already under mpirun (default 4)");
  app.add_option("--reps", opts.reps, "timed runs per op, size and implementation (median reported)");
  app.add_option("--warmup", opts.warmup, "untimed runs first");
  app.add_option("--max-mib", max_mib, "largest size in MiB (default 64)");
  app.add_option("--ops", opts.ops, "comma list of all_reduce, all_gather, reduce_scatter");
  app.add_flag("--quick", opts.quick, "sizes up to 1 MiB, 3 runs (smoke test)");
  CLI11_PARSE(app, argc, argv);
  opts.max_bytes = int64_t(max_mib) << 20;

  if (!tessel::comm::is_mpi_launch()) return relaunch_under_mpirun(ranks, argc, argv);
  try {
    tessel::comm::init_mpi();
    return tessel::tools::run_collectives_bench(opts, std::cout);
  } catch (const tessel::Error& e) {
    std::fprintf(stderr, "bench collectives: %s\n", e.what());
    return 1;
  }
}
