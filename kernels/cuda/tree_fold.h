#pragma once
// The canonical chunk tree (kernels/canonical.h: tree_combine over V leaves,
// left + right at every level) computed while the leaf values arrive in
// ascending order, for host and device (tested against tree_combine in
// test_cuda_plan).
//
// A binary counter: after leaves [0, next) have been folded, slot[l] holds
// the value of the aligned block of 2^l leaves that bit l of `next` stands
// for. Feeding leaf c carries through the set low bits of c exactly as the
// tree pairs its nodes. Only log2(V) + 1 values are live, which is what lets
// a GEMM tile or a segmented sum keep its tree in registers.
//
// Skipped leaves count as +0. That is exact (the same bits as tree_combine
// over the dense array with +0 leaves) whenever no leaf and no partial sum is
// -0 -- true for canonical sums, whose lanes start at +0 and only add (x + y
// is -0 only if both are -0): then +0 + x == x + +0 == x bitwise for every x.
// skip_to() moves the pending blocks to the tree nodes that contain them
// without visiting the skipped leaves.
#include <cstdint>

#include "runtime/macros.h"

namespace tessel::kernels::cuda {

TESSEL_HOST_DEVICE_INLINE int highest_bit(uint64_t x) {  // x != 0
#if defined(__CUDA_ARCH__)
  return 63 - __clzll(static_cast<long long>(x));
#else
  return 63 - __builtin_clzll(x);
#endif
}

template <class T, int kMaxLevels = 10>
struct TreeFold {
  int levels;     // log2 of the number of leaves
  int64_t next;   // leaves [0, next) are folded in
  T slot[kMaxLevels + 1];

  TESSEL_HOST_DEVICE_INLINE explicit TreeFold(int leaves_log2) : levels(leaves_log2), next(0) {
    for (int l = 0; l <= kMaxLevels; ++l) slot[l] = T(0);
  }

  // Leaves [next, c) are +0.
  TESSEL_HOST_DEVICE_INLINE void skip_to(int64_t c) {
    if (c <= next) return;
    T fresh[kMaxLevels + 1];
    for (int l = 0; l <= kMaxLevels; ++l) fresh[l] = T(0);
    // Pending block j (bit j of next) starts at next with bits 0..j cleared;
    // in the tree of leaves [0, c) it belongs to the block of c's bit where
    // start and c first differ. Lower j lie further right: fold right to left.
    for (int j = 0; j < levels; ++j) {
      if (!((next >> j) & 1)) continue;
      const int64_t start = (next >> (j + 1)) << (j + 1);
      const int l = highest_bit(uint64_t(start ^ c));
      fresh[l] = slot[j] + fresh[l];
    }
    for (int l = 0; l <= kMaxLevels; ++l) slot[l] = fresh[l];
    next = c;
  }

  // Leaf c (>= next) has value v.
  TESSEL_HOST_DEVICE_INLINE void feed(int64_t c, T v) {
    skip_to(c);
    int j = 0;
    while ((c >> j) & 1) {
      v = slot[j] + v;
      ++j;
    }
    slot[j] = v;
    next = c + 1;
  }

  // The root, with every remaining leaf +0.
  TESSEL_HOST_DEVICE_INLINE T finish() {
    skip_to(int64_t(1) << levels);
    return slot[levels];
  }
};

// log2 of a power of two.
TESSEL_HOST_DEVICE_INLINE int log2_exact(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

}  // namespace tessel::kernels::cuda
