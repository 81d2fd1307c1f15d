#pragma once
// Lines along one dimension: kernels that work on whole lines (sorting a row,
// summing the positions of a column that hit one destination, masking one row
// of a matrix) enumerate "all coordinates but `dim`" in row-major order and
// need each line's starting offset in several tensors with their own strides.
#include <array>
#include <cstdint>

#include "runtime/tensor.h"

namespace tessel::kernels::cpu {

template <int N>
struct Lines {
  int nd = 0;
  int64_t shape[kMaxDims];
  int64_t stride[N][kMaxDims];  // elements
  int64_t count = 1;            // number of lines

  // `shape` is the iteration shape; strides[k] are tensor k's strides over it.
  Lines(const Dims& iter_shape, int dim, const std::array<const Dims*, N>& strides) {
    for (int d = 0; d < iter_shape.size(); ++d) {
      if (d == dim) continue;
      shape[nd] = iter_shape[d];
      for (int k = 0; k < N; ++k) stride[k][nd] = (*strides[k])[d];
      count *= iter_shape[d];
      ++nd;
    }
  }

  // Element offsets of line `line`'s first element, per tensor.
  void offsets(int64_t line, int64_t* off) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = nd - 1; d >= 0; --d) {
      const int64_t c = line % shape[d];
      line /= shape[d];
      for (int k = 0; k < N; ++k) off[k] += c * stride[k][d];
    }
  }

  // The coordinate of line `line` along iteration dim `d` (d counts the
  // remaining dims, i.e. `dim` already removed).
  int64_t coordinate(int64_t line, int d) const {
    for (int e = nd - 1; e > d; --e) line /= shape[e];
    return line % shape[d];
  }
};

}  // namespace tessel::kernels::cpu
