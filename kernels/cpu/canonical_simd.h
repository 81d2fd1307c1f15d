#pragma once
// AVX2 implementations of the canonical sum (kernels/canonical.h) for float32.
// Each returns exactly the bits of canonical_sum_ref; test_reduce checks it.
#include <immintrin.h>

#include <cstdint>

#include "kernels/canonical.h"

namespace tessel::kernels::cpu {

// Mask with the first k (0..8) lanes set.
inline __m256i first_lanes_mask(int64_t k) {
  alignas(32) static const int32_t table[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(table + 8 - k));
}

// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)); float addition commutes
// exactly, so only the grouping matters.
inline float lane_tree8(__m256 acc) {
  __m128 lo = _mm256_castps256_ps128(acc), hi = _mm256_extractf128_ps(acc, 1);
  __m128 pairs = _mm_hadd_ps(lo, hi);         // l0+l1, l2+l3, l4+l5, l6+l7
  __m128 quads = _mm_hadd_ps(pairs, pairs);   // (l0+l1)+(l2+l3), (l4+l5)+(l6+l7), ...
  return _mm_cvtss_f32(quads) + _mm_cvtss_f32(_mm_shuffle_ps(quads, quads, 1));
}

inline __m256 lane_tree8_cols(const __m256* a) {
  return _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])),
                       _mm256_add_ps(_mm256_add_ps(a[4], a[5]), _mm256_add_ps(a[6], a[7])));
}

// One chunk of contiguous elements x[0..len).
inline float chunk_sum_row(const float* x, int64_t len) {
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(x + j));
  if (j < len) acc = _mm256_add_ps(acc, _mm256_maskload_ps(x + j, first_lanes_mask(len - j)));
  return lane_tree8(acc);
}

// Four equal-length chunks at once (independent dependency chains).
inline void chunk_sum_row4(const float* x0, const float* x1, const float* x2, const float* x3, int64_t len,
                           float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(x0 + j));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(x1 + j));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(x2 + j));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(x3 + j));
  }
  if (j < len) {
    __m256i m = first_lanes_mask(len - j);
    a0 = _mm256_add_ps(a0, _mm256_maskload_ps(x0 + j, m));
    a1 = _mm256_add_ps(a1, _mm256_maskload_ps(x1 + j, m));
    a2 = _mm256_add_ps(a2, _mm256_maskload_ps(x2 + j, m));
    a3 = _mm256_add_ps(a3, _mm256_maskload_ps(x3 + j, m));
  }
  out[0] = lane_tree8(a0);
  out[1] = lane_tree8(a1);
  out[2] = lane_tree8(a2);
  out[3] = lane_tree8(a3);
}

// Chunk values of a contiguous row x[0..n) into vals[0..v).
inline void chunk_sums_row(const float* x, int64_t n, int v, float* vals) {
  const int64_t cs = numerics::chunk_size(n, v);
  int c = 0;
  for (; c + 4 <= v && (c + 4) * cs <= n; c += 4)
    chunk_sum_row4(x + c * cs, x + (c + 1) * cs, x + (c + 2) * cs, x + (c + 3) * cs, cs, vals + c);
  for (; c < v; ++c) {
    int64_t b = numerics::chunk_begin(n, v, c), e = numerics::chunk_end(n, v, c);
    vals[c] = chunk_sum_row(x + b, e - b);
  }
}

// Canonical sum of a contiguous row.
inline float canonical_sum_row(const float* x, int64_t n, int v) {
  float vals[kMaxChunks];
  chunk_sums_row(x, n, v, vals);
  return tree_combine(vals, v, SumCombine<float>());
}

// Canonical sums down `cols` adjacent columns: out[j] = sum over t < n of
// x[t * row_stride + j]. Vectorised across columns, 8 lane accumulators each.
inline void canonical_sum_cols(const float* x, int64_t n, int64_t row_stride, int64_t cols, int v, float* out) {
  alignas(32) float vals[kMaxChunks][8];
  for (int64_t j0 = 0; j0 < cols; j0 += 8) {
    const int64_t w = cols - j0 < 8 ? cols - j0 : 8;
    const __m256i m = first_lanes_mask(w);
    for (int c = 0; c < v; ++c) {
      const int64_t b = numerics::chunk_begin(n, v, c), e = numerics::chunk_end(n, v, c);
      __m256 acc[8];
      for (auto& a : acc) a = _mm256_setzero_ps();
      const float* p = x + b * row_stride + j0;
      int64_t t = b;
      for (; t + 8 <= e; t += 8, p += 8 * row_stride) {
        for (int l = 0; l < 8; ++l) acc[l] = _mm256_add_ps(acc[l], _mm256_maskload_ps(p + l * row_stride, m));
      }
      for (int l = 0; t < e; ++t, ++l, p += row_stride) acc[l] = _mm256_add_ps(acc[l], _mm256_maskload_ps(p, m));
      _mm256_store_ps(vals[c], lane_tree8_cols(acc));
    }
    for (int width = 1; width < v; width *= 2)
      for (int c = 0; c + width < v; c += 2 * width)
        _mm256_store_ps(vals[c], _mm256_add_ps(_mm256_load_ps(vals[c]), _mm256_load_ps(vals[c + width])));
    _mm256_maskstore_ps(out + j0, m, _mm256_load_ps(vals[0]));
  }
}

}  // namespace tessel::kernels::cpu
