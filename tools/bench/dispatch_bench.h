#pragma once
// bench dispatch: what a distributed tensor adds to an op call.
//
// For a few ops (elementwise add, matmul, sum, layer_norm, softmax) on small
// tensors, times the op on plain tensors and the same op on distributed
// tensors whose layout needs no communication (a one-device mesh, and the
// sharded layouts a 2-rank local world keeps in place), median of several
// batches after warm-up. The difference is the dispatch overhead; the
// per-stage breakdown comes from the dispatcher's own timers (propagation =
// Meta run + sharding rule, redistribute decision, kernel on the local
// pieces, wrapping + recording). Ends with one JSON line:
//   {"bench": "dispatch", "ours_s": .., "reference": "the same ops on plain tensors",
//    "reference_s": .., "speedup": reference_s / ours_s, "overhead_us_per_op": ..,
//    "stages_us": {...}, "ops": [...]}
#include <iosfwd>

namespace tessel::tools {

struct DispatchBenchOptions {
  int iters = 2000;  // calls per timed batch
  int reps = 7;      // batches (median reported)
  int threads = 1;   // kernel threads (small ops: 1 keeps the timing about dispatch)
};

int run_dispatch_bench(const DispatchBenchOptions& opts, std::ostream& out);

}  // namespace tessel::tools
