#pragma once
// Launchers of the CUDA indexing kernels (indexing.cu); adapters in
// indexing.cc.
#include <cstdint>

#include <cuda_runtime.h>

#include "kernels/cuda/geometry.h"
#include "runtime/dtype.h"

namespace tessel::kernels::cuda {

// *bad (device int64, preset to INT64_MAX) = first linear position of an
// index (int32/int64, operand 0 of g) outside [0, limit).
void launch_index_bounds(DType index_dtype, const ElemGeometry<1>& g, const void* index, int64_t limit, int64_t* bad,
                         cudaStream_t stream);

// out[p] = src[p + index[p] * step]. Operands: out, index, src. An index
// outside [0, limit) (never reached: the op validates first) writes 0.
void launch_gather(DType dtype, DType index_dtype, const ElemGeometry<3>& g, void* out, const void* index,
                   const void* src, int64_t step, int64_t limit, cudaStream_t stream);

// Row-segmented canonical sums (index_add): out [O, R, I] and src [O, T, I]
// contiguous; positions of destination r are perm[offsets[r] .. offsets[r+1])
// in ascending order (device int64 arrays).
struct SegmentRowsArgs {
  int64_t O = 0, R = 0, T = 0, I = 0;
  int chunks = 16;
  bool accumulate = false;
  const int64_t* offsets = nullptr;  // [R + 1]
  const int64_t* perm = nullptr;     // [T]
  const void* src = nullptr;
  void* out = nullptr;
};
void launch_segment_rows(DType dtype, const SegmentRowsArgs& a, cudaStream_t stream);

// Element-segmented canonical sums (scatter_add): task k writes the sum over
// its positions pos[begin[k] .. begin[k+1]) (ascending t in [0, T)) of
// src[src_base[k] + t * src_stride] into out[out_off[k]] (assigned or added).
struct SegmentTasksArgs {
  int64_t tasks = 0, T = 0, src_stride = 0;
  int chunks = 16;
  bool accumulate = false;
  const int64_t* begin = nullptr;     // [tasks + 1]
  const int64_t* pos = nullptr;
  const int64_t* src_base = nullptr;  // [tasks]
  const int64_t* out_off = nullptr;   // [tasks]
  const void* src = nullptr;
  void* out = nullptr;
};
void launch_segment_tasks(DType dtype, const SegmentTasksArgs& a, cudaStream_t stream);

// triu / tril over the last two dims: unmerged shape and strides of x, out.
struct TriangleArgs {
  int ndim = 0;
  int64_t numel = 0;
  int64_t size[kGeomDims] = {};
  int64_t xstride[kGeomDims] = {};
  int64_t ostride[kGeomDims] = {};
  int64_t k = 0;
  bool upper = false;
};
void launch_triangle(DType dtype, const TriangleArgs& a, const void* x, void* out, cudaStream_t stream);

}  // namespace tessel::kernels::cuda
