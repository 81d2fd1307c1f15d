#pragma once
// Strided iteration over N same-shaped operands, parallel over independent
// elements. The inner callback receives a run of n elements with a byte
// stride per operand; a unit (itemsize) stride on every operand is the fast,
// vectorisable case that kernels special-case.
#include <array>
#include <cstdint>

#include "runtime/tensor.h"
#include "runtime/threadpool.h"

namespace tessel::kernels::cpu {

// Elementwise work below this many elements runs on one thread.
inline constexpr int64_t kElementwiseGrain = 32768;

template <int N>
struct LoopGeometry {
  int ndim = 0;
  int64_t shape[kMaxDims];
  int64_t stride[N][kMaxDims];  // bytes
  char* base[N];
};

// Collapses size-1 dims and merges dims that are contiguous for every operand.
template <int N>
LoopGeometry<N> make_geometry(const std::array<const Tensor*, N>& ops) {
  LoopGeometry<N> g;
  const Dims& shape = ops[0]->shape();
  for (int k = 0; k < N; ++k) g.base[k] = static_cast<char*>(ops[k]->raw_data());
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    g.shape[g.ndim] = shape[d];
    for (int k = 0; k < N; ++k) g.stride[k][g.ndim] = ops[k]->strides()[d] * int64_t(ops[k]->itemsize());
    ++g.ndim;
  }
  // Merge from the innermost dim outwards.
  int out = g.ndim - 1;
  if (g.ndim > 1) {
    for (int d = g.ndim - 2; d >= 0; --d) {
      bool mergeable = true;
      for (int k = 0; k < N; ++k) mergeable = mergeable && g.stride[k][d] == g.stride[k][out] * g.shape[out];
      if (mergeable) {
        g.shape[out] *= g.shape[d];
      } else {
        --out;
        g.shape[out] = g.shape[d];
        for (int k = 0; k < N; ++k) g.stride[k][out] = g.stride[k][d];
      }
    }
    int n = g.ndim - out;
    for (int i = 0; i < n; ++i) {
      g.shape[i] = g.shape[out + i];
      for (int k = 0; k < N; ++k) g.stride[k][i] = g.stride[k][out + i];
    }
    g.ndim = n;
  }
  return g;
}

// inner(n, ptrs, byte_strides) is called on runs covering every element once.
template <int N, class Inner>
void strided_loop(const std::array<const Tensor*, N>& ops, int64_t grain, Inner&& inner) {
  int64_t total = ops[0]->numel();
  if (total == 0) return;
  LoopGeometry<N> g = make_geometry<N>(ops);
  if (g.ndim == 0) {
    int64_t zero[N] = {};
    inner(int64_t(1), g.base, zero);
    return;
  }
  const int last = g.ndim - 1;
  const int64_t inner_n = g.shape[last];
  int64_t inner_stride[N];
  for (int k = 0; k < N; ++k) inner_stride[k] = g.stride[k][last];
  const int64_t outer = total / inner_n;
  const int64_t outer_grain = inner_n >= grain ? 1 : (grain + inner_n - 1) / inner_n;
  if (outer == 1) {
    // One long run: split it across threads.
    parallel_for(inner_n, grain, [&](int64_t b, int64_t e) {
      char* p[N];
      for (int k = 0; k < N; ++k) p[k] = g.base[k] + b * inner_stride[k];
      inner(e - b, p, inner_stride);
    });
    return;
  }
  parallel_for(outer, outer_grain, [&](int64_t ob, int64_t oe) {
    int64_t idx[kMaxDims];
    char* p[N];
    // Multi-index of outer position ob over dims [0, last).
    int64_t rem = ob;
    for (int d = last - 1; d >= 0; --d) {
      idx[d] = rem % g.shape[d];
      rem /= g.shape[d];
    }
    for (int k = 0; k < N; ++k) {
      p[k] = g.base[k];
      for (int d = 0; d < last; ++d) p[k] += idx[d] * g.stride[k][d];
    }
    for (int64_t o = ob; o < oe; ++o) {
      inner(inner_n, p, inner_stride);
      for (int d = last - 1; d >= 0; --d) {
        if (++idx[d] < g.shape[d]) {
          for (int k = 0; k < N; ++k) p[k] += g.stride[k][d];
          break;
        }
        for (int k = 0; k < N; ++k) p[k] -= g.stride[k][d] * (g.shape[d] - 1);
        idx[d] = 0;
      }
    }
  });
}

}  // namespace tessel::kernels::cpu
