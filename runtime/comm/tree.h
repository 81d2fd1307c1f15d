#pragma once
// The deterministic combination of the ranks' contributions (see comm.h and
// docs/comm.md). Device-safe: the NCCL backend's CUDA kernel includes it.
//
// For every element, contributions v[0..n) in communicator rank order are
// combined by the balanced tree of kernels/canonical.h's tree_combine:
//   for (w = 1; w < n; w *= 2) for (i = 0; i + w < n; i += 2w) v[i] = v[i] op v[i + w];
// The runtime may not depend on kernels/, so the loop is written again here.
#include <cstdint>

#include "runtime/macros.h"

namespace tessel::comm {

// Slices of an n-element buffer over `parts` ranks: ceil-division, so the
// trailing slices are short or empty (docs/design.md §2, uneven shards).
TESSEL_HOST_DEVICE_INLINE int64_t slice_stride(int64_t n, int parts) { return (n + parts - 1) / parts; }
TESSEL_HOST_DEVICE_INLINE int64_t slice_begin(int64_t n, int parts, int s) {
  int64_t b = slice_stride(n, parts) * s;
  return b < n ? b : n;
}
TESSEL_HOST_DEVICE_INLINE int64_t slice_len(int64_t n, int parts, int s) {
  return slice_begin(n, parts, s + 1) - slice_begin(n, parts, s);
}

// The tree above evaluated as a binary counter, without an array of n values:
// slot[l] holds the root of a complete subtree of 2^l consecutive leaves; the
// leftover subtrees (n not a power of two) are folded from the smallest up,
// each as the right operand — which is how the level loop finishes them
// (the root splits at the largest power of two below n; test_comm checks
// the two forms against each other for every n up to 130).
// get(i) returns contribution i; combine(a, b) is "a op b".
template <class Acc, class Get, class Combine>
TESSEL_HD Acc tree_fold(int n, Get get, Combine combine) {
  Acc slot[32];
  uint32_t filled = 0;
  for (int i = 0; i < n; ++i) {
    Acc v = get(i);
    int l = 0;
    while (filled & (1u << l)) {
      v = combine(slot[l], v);
      filled &= ~(1u << l);
      ++l;
    }
    slot[l] = v;
    filled |= 1u << l;
  }
  Acc t = Acc();
  bool have = false;
  for (int l = 0; l < 32; ++l) {
    if (!(filled & (1u << l))) continue;
    t = have ? combine(slot[l], t) : slot[l];
    have = true;
  }
  return t;
}

// The combine functions. Max/Min: NaN wins, ties (also -0 vs +0) keep the
// left operand — kernels/canonical.h's MaxCombine/MinCombine. Integer sums
// wrap (computed unsigned, no undefined behaviour).
template <class Acc>
struct TreeSum {
  TESSEL_HD Acc operator()(Acc a, Acc b) const { return a + b; }
};
template <>
struct TreeSum<int32_t> {
  TESSEL_HD int32_t operator()(int32_t a, int32_t b) const { return int32_t(uint32_t(a) + uint32_t(b)); }
};
template <>
struct TreeSum<int64_t> {
  TESSEL_HD int64_t operator()(int64_t a, int64_t b) const { return int64_t(uint64_t(a) + uint64_t(b)); }
};
template <class Acc>
struct TreeMax {
  TESSEL_HD Acc operator()(Acc a, Acc b) const { return a != a ? a : (b != b ? b : (b > a ? b : a)); }
};
template <class Acc>
struct TreeMin {
  TESSEL_HD Acc operator()(Acc a, Acc b) const { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
};

}  // namespace tessel::comm
