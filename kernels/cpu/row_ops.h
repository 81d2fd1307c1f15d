#pragma once
// Building blocks for the row-wise kernel families (softmax, norms, losses):
// row iteration over strided tensors, canonical row sums and maxima for the
// compute types, and canonical column sums with lane accumulators.
//
// Every routine here reproduces the reference order of kernels/canonical.h
// exactly (test_softmax / test_norm compare them bit for bit).
#include <immintrin.h>

#include <array>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/canonical.h"
#include "kernels/cpu/canonical_simd.h"
#include "runtime/tensor.h"
#include "runtime/threadpool.h"

namespace tessel::kernels::cpu {

// Rows of N same-shaped tensors along one dimension: row r is every element
// along `dim`, rows numbered row-major over the other dims. offset(k) is the
// element offset of the current row's first element in tensor k, relative to
// its raw_data(). seek() once per parallel range, next() per row: no division
// in the per-row loop.
template <int N>
class RowCursor {
 public:
  RowCursor(const std::array<const Tensor*, N>& ts, int dim) {
    const Dims& shape = ts[0]->shape();
    for (int d = 0; d < shape.size(); ++d) {
      if (d == dim || shape[d] == 1) continue;
      shape_[nd_] = shape[d];
      for (int k = 0; k < N; ++k) stride_[k][nd_] = ts[k]->strides()[d];
      ++nd_;
    }
    rows_ = 1;
    for (int d = 0; d < nd_; ++d) rows_ *= shape_[d];
  }
  int64_t rows() const { return rows_; }
  void seek(int64_t r) {
    for (int k = 0; k < N; ++k) off_[k] = 0;
    for (int d = nd_ - 1; d >= 0; --d) {
      idx_[d] = r % shape_[d];
      r /= shape_[d];
      for (int k = 0; k < N; ++k) off_[k] += idx_[d] * stride_[k][d];
    }
  }
  void next() {
    for (int d = nd_ - 1; d >= 0; --d) {
      if (++idx_[d] < shape_[d]) {
        for (int k = 0; k < N; ++k) off_[k] += stride_[k][d];
        return;
      }
      for (int k = 0; k < N; ++k) off_[k] -= stride_[k][d] * (shape_[d] - 1);
      idx_[d] = 0;
    }
  }
  int64_t offset(int k) const { return off_[k]; }

 private:
  int nd_ = 0;
  int64_t rows_ = 1;
  int64_t shape_[kMaxDims] = {};
  int64_t stride_[N][kMaxDims] = {};
  int64_t idx_[kMaxDims] = {};
  int64_t off_[N] = {};
};

// Rows per parallel task so that a task holds about kRowGrainElems elements.
inline constexpr int64_t kRowGrainElems = 32768;
inline int64_t row_grain(int64_t row_len) { return std::max<int64_t>(1, kRowGrainElems / std::max<int64_t>(row_len, 1)); }

// Canonical sum of a contiguous row of the compute type (float: AVX2 with the
// reference's bits; double: the reference itself).
inline float row_sum(const float* x, int64_t n, int v) { return canonical_sum_row(x, n, v); }
inline double row_sum(const double* x, int64_t n, int v) { return canonical_sum_ref<double>(x, n, 1, v); }

// The largest value of a row, as a value: NaN if the row holds a NaN, -inf for
// an empty row, and +0 (never -0) when the maximum is a zero, so the result
// does not depend on the order the row is scanned in.
template <class C>
inline C row_max_ref(const C* x, int64_t n) {
  C m = -std::numeric_limits<C>::infinity();
  for (int64_t i = 0; i < n; ++i) m = MaxCombine<C>()(m, x[i]);
  return m + C(0);  // -0 + +0 = +0 in round-to-nearest
}
inline float row_max(const float* x, int64_t n) {
  __m256 acc = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 unord = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i);
    acc = _mm256_max_ps(acc, v);
    unord = _mm256_or_ps(unord, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, acc);
  float m = lanes[0];
  for (int l = 1; l < 8; ++l) m = lanes[l] > m ? lanes[l] : m;
  bool nan = _mm256_movemask_ps(unord) != 0;
  for (; i < n; ++i) {
    nan = nan || x[i] != x[i];
    m = x[i] > m ? x[i] : m;
  }
  if (nan) return std::numeric_limits<float>::quiet_NaN();
  return m + 0.0f;
}
inline double row_max(const double* x, int64_t n) { return row_max_ref(x, n); }

// `x` as a contiguous row of the compute type C: x itself when it already is
// one, else converted into `scratch` (n elements).
template <class C, class T>
inline const C* row_as_compute(const T* x, int64_t n, int64_t stride, C* scratch) {
  if constexpr (std::is_same_v<T, C>) {
    if (stride == 1) return x;
  }
  for (int64_t i = 0; i < n; ++i) scratch[i] = C(load(x[i * stride]));
  return scratch;
}

// Canonical sums down K quantities' columns:
//   out[k][j] = canonical sum over t in [0, m) of value_k(t, j)
// with V chunks over t. fill(t, j0, w, dst) writes value_k(t, j0 + i) to
// dst[k][i] for i < w (dst[k] are rows of kColBlock). Each output follows the
// reference order exactly: lane (t - chunk_begin) % 8 accumulates ascending t
// from +0, lanes combine by the lane tree, chunks by the balanced tree.
// Parallel over (chunk, column block) tasks, so the thread count never matters.
inline constexpr int64_t kColBlock = 128;

template <class C, int K, class Fill>
void canonical_col_sums(int64_t m, int64_t n, int v, Fill fill, const std::array<C*, K>& out) {
  if (n == 0) return;
  const int64_t blocks = (n + kColBlock - 1) / kColBlock;
  std::vector<C> partial(static_cast<size_t>(K) * size_t(v) * size_t(n));  // [K][V][n]
  auto part = [&](int k, int c) { return partial.data() + (size_t(k) * size_t(v) + size_t(c)) * size_t(n); };
  const int64_t tasks = int64_t(v) * blocks;
  const int64_t rows_per_task = std::max<int64_t>(1, m / std::max<int64_t>(v, 1));
  const int64_t grain = std::max<int64_t>(1, kRowGrainElems / (rows_per_task * kColBlock));
  parallel_for(tasks, grain, [&](int64_t tb, int64_t te) {
    alignas(64) C acc[K][numerics::kLanes][kColBlock];
    alignas(64) C vals[K][kColBlock];
    C* dst[K];
    for (int k = 0; k < K; ++k) dst[k] = vals[k];
    for (int64_t task = tb; task < te; ++task) {
      const int c = int(task / blocks);
      const int64_t j0 = (task % blocks) * kColBlock;
      const int64_t w = std::min<int64_t>(kColBlock, n - j0);
      for (int k = 0; k < K; ++k)
        for (int l = 0; l < numerics::kLanes; ++l)
          for (int64_t i = 0; i < kColBlock; ++i) acc[k][l][i] = C(0);
      const int64_t b = numerics::chunk_begin(m, v, c), e = numerics::chunk_end(m, v, c);
      int l = 0;
      for (int64_t t = b; t < e; ++t) {
        fill(t, j0, w, dst);
        for (int k = 0; k < K; ++k) {
          C* a = acc[k][l];
          const C* s = vals[k];
          for (int64_t i = 0; i < w; ++i) a[i] = a[i] + s[i];
        }
        l = l + 1 == numerics::kLanes ? 0 : l + 1;
      }
      for (int k = 0; k < K; ++k) {
        C* o = part(k, c) + j0;
        auto& a = acc[k];
        for (int64_t i = 0; i < w; ++i)
          o[i] = ((a[0][i] + a[1][i]) + (a[2][i] + a[3][i])) + ((a[4][i] + a[5][i]) + (a[6][i] + a[7][i]));
      }
    }
  });
  // Balanced tree over chunks, column by column.
  for (int width = 1; width < v; width *= 2)
    for (int c = 0; c + width < v; c += 2 * width)
      for (int k = 0; k < K; ++k) {
        C* lo = part(k, c);
        const C* hi = part(k, c + width);
        for (int64_t j = 0; j < n; ++j) lo[j] = lo[j] + hi[j];
      }
  for (int k = 0; k < K; ++k) {
    const C* r = part(k, 0);
    for (int64_t j = 0; j < n; ++j) out[k][j] = r[j];
  }
}

}  // namespace tessel::kernels::cpu
