// bench_gemm: see tools/bench/gemm_bench.h.
#include <CLI/CLI.hpp>
#include <iostream>

#include "tools/bench/gemm_bench.h"

int main(int argc, char** argv) {
  tessel::tools::GemmBenchOptions opts;
  CLI::App app{"tessel float32 GEMM (canonical K-order) vs OpenBLAS"};
  app.add_option("--threads", opts.threads, "threads for both libraries");
  app.add_option("--chunks", opts.chunks, "V, the number of K chunks");
  app.add_option("--reps", opts.reps, "timed repetitions per library");
  app.add_flag("--quick", opts.quick, "small shapes only");
  app.add_option("--isa", opts.isa, "auto | avx2 | avx512");
  app.add_option("--filter", opts.filter, "only shapes whose label contains this text");
  bool no_torch = false;
  app.add_flag("--no-torch", no_torch, "leave out the second reference, PyTorch's torch.mm (MKL)");
  app.add_option("--python", opts.python, "Python with torch (default: $TESSEL_PYTHON, ~/.cache/tessel/venv)");
  CLI11_PARSE(app, argc, argv);
  opts.torch = !no_torch;
  tessel::tools::use_best_openblas_core(argv);  // may restart this process
  return tessel::tools::run_gemm_bench(opts, std::cout);
}
