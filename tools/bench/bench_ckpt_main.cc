// Standalone `bench ckpt` (also reachable as `./tessel bench ckpt`).
#include <CLI/CLI.hpp>

#include <iostream>

#include "tools/bench/ckpt_bench.h"

int main(int argc, char** argv) {
  tessel::tools::CkptBenchOptions o;
  CLI::App app{"Checkpoint save/load throughput against a plain sequential copy of the same bytes"};
  app.add_option("--size-mb", o.size_mb, "MiB of tensor data (default 256)");
  app.add_option("--ranks", o.ranks, "ranks (threads) saving and loading (default 2)");
  app.add_option("--reps", o.reps, "repetitions (median; default 5)");
  app.add_option("--dir", o.dir, "scratch folder (default $TMPDIR or /tmp)");
  app.add_flag("--async", o.async, "also time how long an async save blocks the caller");
  bool quick = false;
  app.add_flag("--quick", quick, "64 MiB, 1 rep");
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    o.size_mb = 64;
    o.reps = 1;
  }
  return tessel::tools::run_ckpt_bench(o, std::cout);
}
