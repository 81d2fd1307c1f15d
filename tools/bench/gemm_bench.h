#pragma once
// bench gemm: tessel's canonical-order float32 GEMM against OpenBLAS
// (cblas_sgemm) and, as a second reference, PyTorch's torch.mm (MKL;
// tools/bench/gemm_torch.py in a child process), same run, same thread
// count, interleaved repetitions.
//
// Prints a table (shape, GFLOP/s of both, ratio) and ends with one JSON line:
//   {"bench": "gemm", "ours_s": .., "reference": "openblas", "reference_s": ..,
//    "speedup": reference_s / ours_s, "threads": .., "chunks": .., "isa": ..,
//    "reference_kernel": "openblas SkylakeX", "shapes": [..],
//    "torch_reference": {"name", "reference_s", "speedup"} (or {"error"} where no Python with torch),
//    "machine": {..}, "loaded": ..}   (tools/bench/machine.h)
// ours_s / reference_s sum the median times over the large shapes
// (M*N*K >= 1024^3; over all shapes run when none is large, e.g. --quick);
// "shapes" lists every shape with its own medians.
#include <iosfwd>
#include <string>

namespace tessel::tools {

struct GemmBenchOptions {
  int threads = 2;
  int chunks = 16;       // V for tessel's GEMM
  int reps = 5;          // timed repetitions per library (median reported)
  bool quick = false;    // small shapes only (smoke test)
  std::string isa = "auto";  // auto | avx2 | avx512
  std::string filter;    // only shapes whose label contains this
  bool torch = true;     // time torch.mm too (skipped, with the reason, where no Python has torch)
  std::string python;    // "": reference_python()
};

// OpenBLAS picks its kernels by CPU model and falls back to a generic core
// (Prescott: SSE3) on CPUs it does not recognise -- this virtual AVX-512 one
// among them -- which would make the reference slower than it is. When
// OPENBLAS_CORETYPE is unset and the core OpenBLAS chose is not the one for
// the CPU's ISA (SkylakeX for AVX-512, Haswell for AVX2), sets it and
// re-executes this process (the variable is read when the library loads);
// otherwise returns. The core in use is printed and recorded in the JSON line
// ("reference_kernel").
void use_best_openblas_core(char** argv);

// Runs the benchmark, writing the table and the JSON line to `out`.
// Returns 0, or 1 if a result disagrees with OpenBLAS beyond rounding.
int run_gemm_bench(const GemmBenchOptions& opts, std::ostream& out);

}  // namespace tessel::tools
