// `tessel bench gemm`: the float32 GEMM against OpenBLAS (tools/bench/gemm_bench.h).
#include <iostream>

#include "tools/bench/gemm_bench.h"
#include "tools/cli/commands.h"

namespace tessel::cli {

void register_bench_gemm(CLI::App& app) {
  static tools::GemmBenchOptions o;
  CLI::App* cmd = add_command(*bench_command(app), "gemm", "float32 GEMM (canonical K-order) against OpenBLAS",
                              [] { return tools::run_gemm_bench(o, std::cout); });
  cmd->add_option("--threads", o.threads, "threads for both libraries")->capture_default_str();
  cmd->add_option("--chunks", o.chunks, "V, the number of K chunks")->capture_default_str();
  cmd->add_option("--reps", o.reps, "timed repetitions per library")->capture_default_str();
  cmd->add_flag("--quick", o.quick, "small shapes only");
  cmd->add_option("--isa", o.isa, "auto | avx2 | avx512")->capture_default_str();
  cmd->add_option("--filter", o.filter, "only shapes whose label contains this text");
}

}  // namespace tessel::cli
