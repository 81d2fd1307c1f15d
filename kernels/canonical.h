#pragma once
// The canonical reduction order (docs/design.md §4 level 3; docs/numerics.md).
//
// Reference definitions, written once for host and device. Optimised kernels
// (SIMD on CPU, warps on CUDA) must reproduce these bits exactly; each has a
// test comparing it to these.
//
// Sum of x[0..n) with V chunks:
//   chunk c = [c*ceil(n/V), (c+1)*ceil(n/V)) clipped to n
//   inside a chunk, element t goes to lane (t - chunk_begin) % 8; each lane
//   starts at +0 and adds its elements in ascending order;
//   chunk value = ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7));
//   result = balanced tree over chunks: level 1 adds (c0+c1), (c2+c3), ...,
//   level 2 adds neighbouring level-1 results, and so on.
// Max and min use the same structure with a NaN-propagating max/min and
// -inf/+inf as the empty value.
#include <cstdint>

#include "runtime/macros.h"
#include "runtime/numerics.h"

namespace tessel::kernels {

inline constexpr int kMaxChunks = 1024;

// Balanced tree over vals[0..v) (v a power of two), in place; returns vals[0].
template <class T, class Combine>
TESSEL_HD T tree_combine(T* vals, int v, Combine combine) {
  for (int width = 1; width < v; width *= 2)
    for (int i = 0; i + width < v; i += 2 * width) vals[i] = combine(vals[i], vals[i + width]);
  return vals[0];
}

template <class T>
TESSEL_HD T lane_tree(const T* l, T (*combine)(T, T)) {
  return combine(combine(combine(l[0], l[1]), combine(l[2], l[3])), combine(combine(l[4], l[5]), combine(l[6], l[7])));
}

// One chunk [b, e) of a reduction: load(t) gives element t as Acc.
template <class Acc, class Load, class Combine>
TESSEL_HD Acc chunk_reduce_ref(int64_t b, int64_t e, Acc identity, Load load, Combine combine) {
  Acc lanes[numerics::kLanes];
  for (int l = 0; l < numerics::kLanes; ++l) lanes[l] = identity;
  for (int64_t t = b; t < e; ++t) {
    int l = int((t - b) % numerics::kLanes);
    lanes[l] = combine(lanes[l], load(t));
  }
  return combine(combine(combine(lanes[0], lanes[1]), combine(lanes[2], lanes[3])),
                 combine(combine(lanes[4], lanes[5]), combine(lanes[6], lanes[7])));
}

// The whole canonical reduction of n elements with v chunks (host reference).
template <class Acc, class Load, class Combine>
Acc canonical_reduce_ref(int64_t n, int v, Acc identity, Load load, Combine combine) {
  Acc vals[kMaxChunks];
  for (int c = 0; c < v; ++c)
    vals[c] = chunk_reduce_ref<Acc>(numerics::chunk_begin(n, v, c), numerics::chunk_end(n, v, c), identity, load,
                                    combine);
  return tree_combine(vals, v, combine);
}

template <class Acc>
struct SumCombine {
  TESSEL_HD Acc operator()(Acc a, Acc b) const { return a + b; }
};
template <class Acc>
struct MaxCombine {  // NaN wins; on ties (including -0 vs +0) the left operand wins
  TESSEL_HD Acc operator()(Acc a, Acc b) const { return a != a ? a : (b != b ? b : (b > a ? b : a)); }
};
template <class Acc>
struct MinCombine {
  TESSEL_HD Acc operator()(Acc a, Acc b) const { return a != a ? a : (b != b ? b : (b < a ? b : a)); }
};

// Canonical sum of x[0], x[stride], ... (n elements) — the reference.
template <class Acc, class T>
Acc canonical_sum_ref(const T* x, int64_t n, int64_t stride, int v) {
  return canonical_reduce_ref<Acc>(
      n, v, Acc(0), [&](int64_t t) { return Acc(static_cast<Acc>(x[t * stride])); }, SumCombine<Acc>());
}

}  // namespace tessel::kernels
