#pragma once
// The segmented canonical sum of one destination element (the CUDA
// scatter-adds, indexing.cu), written for host and device so test_cuda_plan
// runs this very code against kernels/cpu/segment_sum.h's dense reference.
//
// Positions pos[0..n) (ascending, in [0, T)) hit the destination; position t
// belongs to chunk c = t / ceil(T/V) and lane (t - c * ceil(T/V)) % 8. Lanes
// start at +0 and add in ascending t; a chunk closes with the lane tree;
// chunk values fold into the balanced tree over the V chunks (tree_fold.h),
// chunks without positions being +0.
#include <cstdint>

#include "kernels/cuda/tree_fold.h"
#include "runtime/macros.h"
#include "runtime/numerics.h"

#if defined(__CUDACC__)
#define TESSEL_UNROLL _Pragma("unroll")
#else
#define TESSEL_UNROLL
#endif

namespace tessel::kernels::cuda {

// lanes[l] += v with l known only at run time, keeping the lanes in registers.
template <class Acc>
TESSEL_HOST_DEVICE_INLINE void add_to_lane(Acc* lanes, int l, Acc v) {
TESSEL_UNROLL
  for (int q = 0; q < 8; ++q)
    if (q == l) lanes[q] = lanes[q] + v;
}

template <class Acc>
TESSEL_HOST_DEVICE_INLINE Acc lane_tree8(const Acc* l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

template <class Acc, class Value>
TESSEL_HOST_DEVICE_INLINE Acc segment_sum(const int64_t* pos, int64_t n, int64_t T, int V, Value value) {
  const int64_t cs = numerics::chunk_size(T, V);
  TreeFold<Acc> fold(log2_exact(V));
  Acc lanes[8];
TESSEL_UNROLL
  for (int q = 0; q < 8; ++q) lanes[q] = Acc(0);
  int64_t cur = -1;
  for (int64_t k = 0; k < n; ++k) {
    const int64_t t = pos[k];
    const int64_t c = t / cs;
    if (c != cur) {
      if (cur >= 0) {
        fold.feed(cur, lane_tree8(lanes));
TESSEL_UNROLL
        for (int q = 0; q < 8; ++q) lanes[q] = Acc(0);
      }
      cur = c;
    }
    add_to_lane(lanes, int((t - c * cs) % 8), value(t));
  }
  if (cur >= 0) fold.feed(cur, lane_tree8(lanes));
  return fold.finish();
}

}  // namespace tessel::kernels::cuda
