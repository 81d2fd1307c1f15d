#pragma once
// bench fusion: what compile mode's fusion of elementwise chains gives
// (runtime/capture_fusion.cc, docs/compile.md "Fusion").
//
// Each case is a chain of elementwise ops on [rows, cols] float32 tensors
// (SwiGLU's forward and backward, bias + GELU + residual, a chain of four
// binary ops), recorded once with fusion and once without; the two programs
// are replayed in turn, `reps` batches of `iters` replays each side, and
// their outputs compared bit for bit. Ends with one JSON line:
//   {"bench": "fusion", "ours_s": (fused, summed over the cases),
//    "reference": "the same recorded launches, unfused", "reference_s": ..,
//    "speedup": reference_s / ours_s, "same_bits": .., "cases": [...]}
#include <cstdint>
#include <iosfwd>

namespace tessel::tools {

struct FusionBenchOptions {
  int64_t rows = 2048;  // tokens (LLaMA small's batch of 8 x 256)
  int64_t cols = 1536;  // features (LLaMA small's hidden width)
  int iters = 20;       // replays per timed batch
  int reps = 7;         // batches per side, interleaved (median reported)
  int threads = 0;      // kernel threads (0: TESSEL_THREADS, else all cores)
};

int run_fusion_bench(const FusionBenchOptions& opts, std::ostream& out);

}  // namespace tessel::tools
