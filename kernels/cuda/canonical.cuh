#pragma once
// The canonical reduction order of kernels/canonical.h on the GPU, bit for
// bit (docs/design.md §4 levels 3-4). Two mappings of the same definition:
//
//   block_canonical_reduce: one block reduces one sequence. Thread 8s + l is
//     lane l of chunk slot s: it adds elements b + l, b + l + 8, ... of its
//     chunk in ascending order (the reference's lane), consecutive threads
//     reading consecutive elements. The lane tree
//     ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)) is a butterfly over the 8 threads
//     with the lower index always on the left; chunk values go to shared
//     memory and the balanced tree over chunks runs level by level.
//   chunk_reduce_lanes: one thread reduces one chunk with its 8 lanes in
//     registers (unrolled by 8, so lane = (t - b) % 8 is a compile-time index).
//
// Combine functors take (left, right) and are never assumed commutative (max
// keeps the left operand on ties, so order matters for -0/+0).
#include <cuda_runtime.h>

#include "kernels/canonical.h"
#include "runtime/numerics.h"

namespace tessel::kernels::cuda {

template <class T>
__device__ __forceinline__ T shfl_xor(T v, int mask) {
  return __shfl_xor_sync(0xffffffffu, v, mask);
}

// All 32 threads of the warp must call it; every thread of an aligned group
// of 8 returns the lane tree of the group's values.
template <class T, class Combine>
__device__ __forceinline__ T lane_tree_shfl(T v, Combine comb) {
  const int lane = threadIdx.x & 7;
#pragma unroll
  for (int w = 1; w < 8; w *= 2) {
    const T o = shfl_xor(v, w);
    v = (lane & w) ? comb(o, v) : comb(v, o);
  }
  return v;
}

// The canonical reduction of load(0 .. n-1) with V chunks by the whole block.
// blockDim.x must be a multiple of 32 (launch.h: row_block_threads). smem
// holds at least V values and is free again when this returns. Every thread
// returns the result.
template <class Acc, class Load, class Combine>
__device__ Acc block_canonical_reduce(int64_t n, int V, Acc identity, Load load, Combine comb, Acc* smem) {
  const int lane = threadIdx.x & 7;
  const int slot = threadIdx.x >> 3, slots = blockDim.x >> 3;
  const int64_t cs = numerics::chunk_size(n, V);
  for (int c0 = 0; c0 < V; c0 += slots) {  // uniform over the block
    const int c = c0 + slot;
    Acc acc = identity;
    if (c < V) {
      const int64_t b = numerics::chunk_begin(n, V, c), e = numerics::chunk_end(n, V, c);
      // kBatch of the lane's elements are loaded before they are added (in
      // order): that many loads in flight, where one add waiting on each
      // load left the kernel bound by memory latency.
      constexpr int kBatch = 8;
      int64_t t = b + lane;
      for (; t + 8 * (kBatch - 1) < e; t += 8 * kBatch) {
        Acc v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) v[u] = load(t + 8 * u);
#pragma unroll
        for (int u = 0; u < kBatch; ++u) acc = comb(acc, v[u]);
      }
      for (; t < e; t += 8) acc = comb(acc, load(t));
    }
    acc = lane_tree_shfl(acc, comb);
    if (lane == 0 && c < V) smem[c] = acc;
  }
  __syncthreads();
  for (int w = 1; w < V; w *= 2) {
    for (int i = threadIdx.x; int64_t(i) * 2 * w < V; i += blockDim.x) {
      const int a = 2 * w * i;
      if (a + w < V) smem[a] = comb(smem[a], smem[a + w]);
    }
    __syncthreads();
  }
  const Acc r = smem[0];
  __syncthreads();
  return r;
}

// One chunk [b, e) by one thread: lane q accumulates b + q, b + q + 8, ...
template <class Acc, class Load, class Combine>
__device__ __forceinline__ Acc chunk_reduce_lanes(int64_t b, int64_t e, Acc identity, Load load, Combine comb) {
  Acc l[8];
#pragma unroll
  for (int q = 0; q < 8; ++q) l[q] = identity;
  int64_t t = b;
  // 32 elements loaded before they are added (each lane's in order): 32
  // loads in flight per thread, not 8 (memory latency bound the column sums).
  for (; t + 32 <= e; t += 32) {
    Acc v[32];
#pragma unroll
    for (int u = 0; u < 32; ++u) v[u] = load(t + u);
#pragma unroll
    for (int u = 0; u < 32; ++u) l[u & 7] = comb(l[u & 7], v[u]);
  }
  for (; t + 8 <= e; t += 8) {
#pragma unroll
    for (int q = 0; q < 8; ++q) l[q] = comb(l[q], load(t + q));
  }
#pragma unroll
  for (int q = 0; q < 8; ++q)
    if (t + q < e) l[q] = comb(l[q], load(t + q));
  return comb(comb(comb(l[0], l[1]), comb(l[2], l[3])), comb(comb(l[4], l[5]), comb(l[6], l[7])));
}

// In place over vals[0], vals[stride], ... (V values): tree_combine.
template <class Acc, class Combine>
__device__ __forceinline__ Acc tree_combine_strided(Acc* vals, int64_t stride, int V, Combine comb) {
  for (int w = 1; w < V; w *= 2)
    for (int i = 0; i + w < V; i += 2 * w) vals[i * stride] = comb(vals[i * stride], vals[(i + w) * stride]);
  return vals[0];
}

// Shared memory as an array of T (dynamic, sized at launch).
template <class T>
__device__ __forceinline__ T* shared_array() {
  extern __shared__ __align__(16) unsigned char tessel_smem[];
  return reinterpret_cast<T*>(tessel_smem);
}

// The row maximum as a value (kernels/softmax.h): NaN if any element is NaN,
// +0 (never -0) for a zero maximum; -inf for an empty row.
template <class C, class Load>
__device__ __forceinline__ C block_row_max(int64_t n, int V, Load load, C* smem) {
  return block_canonical_reduce<C>(n, V, -INFINITY, load, MaxCombine<C>(), smem) + C(0);
}

}  // namespace tessel::kernels::cuda
