#pragma once
// Launch-configuration math shared by the CUDA launchers and tested on the
// CPU (test_cuda_plan). No CUDA headers.
#include <cstdint>

#include "kernels/cuda/geometry.h"
#include "runtime/macros.h"

namespace tessel::kernels::cuda {

// Threads per block of the elementwise kernels.
inline constexpr int kThreads = 256;
// Grid-stride loops never need more blocks than this (65535 x 256 threads
// keep every SM of any current GPU busy; more only adds scheduling).
inline constexpr int64_t kMaxBlocks = 65535;

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Blocks for a grid-stride loop over n items with `threads` per block.
inline unsigned grid_blocks(int64_t n, int threads = kThreads) {
  const int64_t b = ceil_div(n, threads);
  return unsigned(b < 1 ? 1 : (b < kMaxBlocks ? b : kMaxBlocks));
}

// Threads of the block-per-row canonical reductions (reduce_block.cuh): 8
// lanes per chunk slot, min(V, 32) slots (more chunks loop), at least one warp.
inline int row_block_threads(int chunks) {
  const int slots = chunks < 32 ? chunks : 32;
  const int t = 8 * slots;
  return t < 32 ? 32 : t;
}

// How the general `reduce` kernel maps a reduction onto the GPU:
//   Row:    one block per output; its lanes read consecutive elements (good
//           when the reduced elements are contiguous, or outputs are few);
//   Column: one thread per (output, chunk), consecutive threads on
//           consecutive outputs (good when outputs are adjacent in memory and
//           the reduced stride is not 1), then a tree kernel per output.
// Both compute the canonical order exactly; the choice only moves speed.
enum class ReducePath { Row, Column };

inline ReducePath choose_reduce_path(const ReduceGeometry& g) {
  const bool red_contiguous = g.red_ndim >= 1 && g.red_stride[g.red_ndim - 1] == 1;
  const bool out_adjacent = g.kept_ndim >= 1 && g.kept_xstride[g.kept_ndim - 1] == 1;
  if (g.outputs <= 1 || red_contiguous) return ReducePath::Row;
  return out_adjacent && g.outputs >= 32 ? ReducePath::Column : ReducePath::Row;
}

}  // namespace tessel::kernels::cuda
