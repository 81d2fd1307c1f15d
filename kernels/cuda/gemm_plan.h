#pragma once
// Tiling of the bitwise CUDA GEMM (matmul.cu) -- host-side planning, no CUDA
// headers; test_cuda_plan checks the plan and replays the kernel's
// per-element schedule on the CPU against gemm_reference_f32.
//
// The arithmetic is docs/gemm.md's: per C element, V chunks of ceil(K/V) over
// K; chunk c is acc = fma(a[i,k], b[k,j], acc) for ascending k from +0; the
// chunk values combined by the balanced tree; C = C_old + root or root.
//
// How the kernel computes it:
//   * a block owns a 64 x 64 tile of C (256 threads, 4 x 4 elements each) and
//     a *group* of G = 2^group_levels consecutive chunks (an aligned subtree);
//   * per chunk it walks K in steps of 16 (shared-memory tiles of A and B),
//     starting at the chunk's first k; k positions past the chunk's end are
//     loaded as 0 in *both* A and B, and fma(0, 0, acc) == acc because acc is
//     never -0 (it starts at +0, and an exact sum is -0 only if both addends
//     are -0), so padding never changes a bit;
//   * chunk values are folded by a binary counter in registers (tree_fold.h:
//     the same pairs as the balanced tree);
//   * with one group (P = V / G = 1) the block writes C; otherwise each group
//     root goes to a workspace [P][batch][M][N] and a second kernel folds the
//     P roots (the top levels of the same tree) and writes C.
// Rows/columns past M/N compute on zero-padded operands and are never
// written; every element runs the same sequence wherever it sits (position
// independence).
#include <cstdint>

namespace tessel::kernels::cuda {

struct GemmTiling {
  static constexpr int kBM = 64, kBN = 64, kBK = 16;
  static constexpr int kTM = 4, kTN = 4;
  static constexpr int kThreads = 256;
  // Register tree depth of the fast kernel (groups of up to 16 chunks); a
  // second instantiation keeps up to 2^10 chunks (its tree spills to local
  // memory, used only when a larger V cannot be split into workspace).
  static constexpr int kRegLevels = 4, kMaxLevels = 10;
};

struct BitwiseGemmPlan {
  int64_t tiles_m = 0, tiles_n = 0;
  int group_levels = 0;  // G = 2^group_levels chunks per block
  int groups = 1;        // P = V / G
  int max_levels = GemmTiling::kRegLevels;  // kernel instantiation: kRegLevels or kMaxLevels
  int64_t workspace_elems = 0;  // P * batch * M * N when P > 1
};

inline int64_t gemm_chunk_size(int64_t k, int chunks) { return (k + chunks - 1) / chunks; }

// sm_count: multiprocessors of the device; workspace_cap: the most compute-
// type elements the group workspace may take.
inline BitwiseGemmPlan plan_bitwise_gemm(int64_t m, int64_t n, int64_t k, int64_t batch, int chunks, int sm_count,
                                         int64_t workspace_cap) {
  BitwiseGemmPlan p;
  p.tiles_m = (m + GemmTiling::kBM - 1) / GemmTiling::kBM;
  p.tiles_n = (n + GemmTiling::kBN - 1) / GemmTiling::kBN;
  int levels = 0;
  while ((1 << levels) < chunks) ++levels;
  const int64_t outputs = batch * m * n;
  p.group_levels = levels;
  p.groups = 1;
  // Split a deep tree into register-sized groups when the workspace allows.
  while (p.group_levels > GemmTiling::kRegLevels && int64_t(p.groups) * 2 * outputs <= workspace_cap) {
    p.groups *= 2;
    --p.group_levels;
  }
  // Too few tiles to fill the GPU: split the K range further (more blocks,
  // each still at least 64 k-steps long).
  const int64_t tiles = p.tiles_m * p.tiles_n * batch;
  while (p.group_levels > 0 && tiles * p.groups < 2 * int64_t(sm_count) &&
         gemm_chunk_size(k, chunks) * (int64_t(1) << (p.group_levels - 1)) >= 64 &&
         int64_t(p.groups) * 2 * outputs <= workspace_cap) {
    p.groups *= 2;
    --p.group_levels;
  }
  p.max_levels = p.group_levels <= GemmTiling::kRegLevels ? GemmTiling::kRegLevels : GemmTiling::kMaxLevels;
  p.workspace_elems = p.groups > 1 ? int64_t(p.groups) * outputs : 0;
  return p;
}

}  // namespace tessel::kernels::cuda
