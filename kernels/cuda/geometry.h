#pragma once
// Iteration geometry passed by value to CUDA kernels: plain structs and
// host/device index math, no CUDA or tensor headers (nvcc compiles it; the
// host-side builders live in geometry_build.h and are tested on the CPU in
// test_cuda_plan).
#include <cstdint>

#include "runtime/macros.h"

namespace tessel::kernels::cuda {

inline constexpr int kGeomDims = 8;

// N same-shaped operands: element `linear` (row-major over the shape) lives at
// offset sum_d idx_d * stride[k][d] (elements) in operand k. Size-1 dims are
// dropped and dims contiguous for every operand are merged, so most tensors
// reach the kernel with ndim <= 2. `contiguous`: ndim <= 1 and every operand
// has unit stride (offset == linear for all of them).
template <int N>
struct ElemGeometry {
  int ndim = 0;
  bool contiguous = true;
  int64_t numel = 0;
  int64_t size[kGeomDims] = {};
  int64_t stride[N][kGeomDims] = {};
};

template <int N>
TESSEL_HOST_DEVICE_INLINE void elem_offsets(const ElemGeometry<N>& g, int64_t linear, int64_t* off) {
  for (int k = 0; k < N; ++k) off[k] = 0;
  if (g.contiguous) {
    for (int k = 0; k < N; ++k) off[k] = linear;
    return;
  }
  int64_t rem = linear;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t sz = g.size[d];
    const int64_t i = d == 0 ? rem : rem % sz;
    rem = d == 0 ? 0 : rem / sz;
    for (int k = 0; k < N; ++k) off[k] += i * g.stride[k][d];
  }
}

// Rows along one dimension of N same-shaped operands (softmax, arg-reduce,
// sort): row r is every element along `dim`, rows numbered row-major over the
// other dims. Element t of row r of operand k sits at
// row_offset(r, k) + t * inner_stride[k].
template <int N>
struct RowGeometry {
  int ndim = 0;  // outer (non-row) dims kept
  int64_t rows = 0;
  int64_t n = 0;  // row length
  int64_t size[kGeomDims] = {};
  int64_t stride[N][kGeomDims] = {};
  int64_t inner_stride[N] = {};
};

template <int N>
TESSEL_HOST_DEVICE_INLINE int64_t row_offset(const RowGeometry<N>& g, int64_t row, int k) {
  int64_t off = 0, rem = row;
  for (int d = g.ndim - 1; d >= 0; --d) {
    const int64_t i = rem % g.size[d];
    rem /= g.size[d];
    off += i * g.stride[k][d];
  }
  return off;
}

// A reduction of x into out (keepdim form): O outputs (the kept dims,
// row-major) each reducing R elements (the reduced dims, row-major in x's
// logical order). Element t of output o is x[x_offset(o) + red_offset(t)];
// the output is out[out_offset(o)].
struct ReduceGeometry {
  int kept_ndim = 0, red_ndim = 0;
  int64_t outputs = 0, n = 0;
  int64_t kept_size[kGeomDims] = {};
  int64_t kept_xstride[kGeomDims] = {};
  int64_t kept_ostride[kGeomDims] = {};
  int64_t red_size[kGeomDims] = {};
  int64_t red_stride[kGeomDims] = {};
};

TESSEL_HOST_DEVICE_INLINE void reduce_output_offsets(const ReduceGeometry& g, int64_t o, int64_t* xoff,
                                                     int64_t* ooff) {
  int64_t x = 0, y = 0, rem = o;
  for (int d = g.kept_ndim - 1; d >= 0; --d) {
    const int64_t i = rem % g.kept_size[d];
    rem /= g.kept_size[d];
    x += i * g.kept_xstride[d];
    y += i * g.kept_ostride[d];
  }
  *xoff = x;
  *ooff = y;
}

TESSEL_HOST_DEVICE_INLINE int64_t reduce_element_offset(const ReduceGeometry& g, int64_t t) {
  if (g.red_ndim == 1) return t * g.red_stride[0];
  int64_t off = 0, rem = t;
  for (int d = g.red_ndim - 1; d >= 0; --d) {
    const int64_t i = rem % g.red_size[d];
    rem /= g.red_size[d];
    off += i * g.red_stride[d];
  }
  return off;
}

}  // namespace tessel::kernels::cuda
