#pragma once
// Host-side builders of the kernel geometries in geometry.h (plain C++ on
// shapes and strides; test_cuda_plan checks them on the CPU).
#include <array>

#include "kernels/cuda/geometry.h"
#include "runtime/shape.h"
#include "runtime/tensor.h"

namespace tessel::kernels::cuda {

// Drops size-1 dims and merges dims that are contiguous for every operand.
template <int N>
ElemGeometry<N> make_elem_geometry(const Dims& shape, const std::array<const Dims*, N>& strides) {
  ElemGeometry<N> g;
  g.numel = numel_of(shape);
  int nd = 0;
  int64_t size[kMaxDims];
  int64_t st[N][kMaxDims];
  for (int d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    size[nd] = shape[d];
    for (int k = 0; k < N; ++k) st[k][nd] = (*strides[k])[d];
    ++nd;
  }
  // Merge from the innermost dim outwards: dim d folds into the next kept one
  // when stride[d] == stride[inner] * size[inner] for every operand.
  int out = 0;
  for (int d = 0; d < nd; ++d) {
    if (out > 0) {
      bool merge = true;
      for (int k = 0; k < N; ++k) merge = merge && g.stride[k][out - 1] == st[k][d] * size[d];
      if (merge) {
        g.size[out - 1] *= size[d];
        for (int k = 0; k < N; ++k) g.stride[k][out - 1] = st[k][d];
        continue;
      }
    }
    g.size[out] = size[d];
    for (int k = 0; k < N; ++k) g.stride[k][out] = st[k][d];
    ++out;
  }
  g.ndim = out;
  g.contiguous = out == 0 || out == 1;
  if (out == 1)
    for (int k = 0; k < N; ++k) g.contiguous = g.contiguous && g.stride[k][0] == 1;
  return g;
}

template <int N>
ElemGeometry<N> make_elem_geometry(const std::array<const Tensor*, N>& ts) {
  std::array<const Dims*, N> strides;
  for (int k = 0; k < N; ++k) strides[k] = &ts[k]->strides();
  return make_elem_geometry<N>(ts[0]->shape(), strides);
}

// Rows along `dim` (every other dim, size-1 dims dropped, in row-major order).
template <int N>
RowGeometry<N> make_row_geometry(const Dims& shape, int dim, const std::array<const Dims*, N>& strides) {
  RowGeometry<N> g;
  g.n = shape[dim];
  g.rows = 1;
  for (int d = 0; d < shape.size(); ++d) {
    if (d == dim) continue;
    g.rows *= shape[d];
    if (shape[d] == 1) continue;
    g.size[g.ndim] = shape[d];
    for (int k = 0; k < N; ++k) g.stride[k][g.ndim] = (*strides[k])[d];
    ++g.ndim;
  }
  for (int k = 0; k < N; ++k) g.inner_stride[k] = (*strides[k])[dim];
  return g;
}

template <int N>
RowGeometry<N> make_row_geometry(const std::array<const Tensor*, N>& ts, int dim) {
  std::array<const Dims*, N> strides;
  for (int k = 0; k < N; ++k) strides[k] = &ts[k]->strides();
  return make_row_geometry<N>(ts[0]->shape(), dim, strides);
}

// x reduced into out (keepdim form: a reduced dim has size 1 in out).
ReduceGeometry make_reduce_geometry(const Dims& xshape, const Dims& xstrides, const Dims& oshape,
                                    const Dims& ostrides);

}  // namespace tessel::kernels::cuda
