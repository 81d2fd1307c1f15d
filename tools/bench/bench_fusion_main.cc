// Standalone `bench fusion` (also reachable as `./tessel bench fusion`).
#include <CLI/CLI.hpp>

#include <iostream>

#include "tools/bench/fusion_bench.h"

int main(int argc, char** argv) {
  tessel::tools::FusionBenchOptions o;
  CLI::App app{"Compile mode's fused elementwise chains against the same launches unfused"};
  app.add_option("--rows", o.rows, "rows of every tensor")->capture_default_str();
  app.add_option("--cols", o.cols, "columns of every tensor")->capture_default_str();
  app.add_option("--iters", o.iters, "replays per timed batch")->capture_default_str();
  app.add_option("--reps", o.reps, "timed batches per side, interleaved (median)")->capture_default_str();
  app.add_option("--threads", o.threads, "kernel threads (0: TESSEL_THREADS, else all cores)")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  return tessel::tools::run_fusion_bench(o, std::cout);
}
