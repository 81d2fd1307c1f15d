// Standalone `bench dispatch` (also reachable as `./tessel bench dispatch`).
#include <CLI/CLI.hpp>

#include <iostream>

#include "tools/bench/dispatch_bench.h"

int main(int argc, char** argv) {
  tessel::tools::DispatchBenchOptions o;
  CLI::App app{"Distributed dispatch overhead per op"};
  app.add_option("--iters", o.iters, "calls per timed batch");
  app.add_option("--reps", o.reps, "timed batches (median)");
  app.add_option("--threads", o.threads, "kernel threads");
  CLI11_PARSE(app, argc, argv);
  return tessel::tools::run_dispatch_bench(o, std::cout);
}
