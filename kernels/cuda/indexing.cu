// CUDA indexing kernels: bounds checks, indexed loads, the deterministic
// segmented scatter-adds, triangular masks.
//
// The scatter-adds follow kernels/cpu/segment_sum.h bit for bit without
// atomics: the host groups source positions by destination (ascending t);
// each destination element then walks its own positions, adding each into
// lane (t - chunk_begin) % 8 of its chunk, closes a chunk with the lane tree
// and folds the chunk values with tree_fold.h (skipped chunks are +0, exact
// because a canonical partial sum is never -0).
#include <algorithm>
#include <cstdint>
#include <cuda_runtime.h>
#include <limits>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cuda/call.h"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/geometry.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/segment.h"
#include "kernels/elementwise.h"
#include "kernels/indexing.h"
#include "runtime/dtype.h"
#include "runtime/numerics.h"

// ---- launch interface: what the adapters at the end call ----
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

namespace tessel::kernels::cuda {
namespace {

template <class F>
void dispatch_index(DType t, const char* op, F&& f) {
  if (t == DType::Int32) return f(TypeTag<int32_t>{});
  if (t == DType::Int64) return f(TypeTag<int64_t>{});
  fail(op, "indices must be int32 or int64");
}

template <class I>
struct BoundsFn {
  const I* idx;
  int64_t limit;
  int64_t* bad;
  int64_t numel;
  __device__ void operator()(const int64_t* off) const {
    const int64_t v = int64_t(idx[off[0]]);
    (void)numel;
    if (v < 0 || v >= limit) {
      // off[0] is not the linear position for strided indices; the adapter
      // passes a contiguous index, where it is.
      atomicMin(reinterpret_cast<unsigned long long*>(bad), static_cast<unsigned long long>(off[0]));
    }
  }
};

template <class T, class I>
struct GatherFn {
  T* o;
  const I* idx;
  const T* src;
  int64_t step, limit;
  __device__ void operator()(const int64_t* off) const {
    const int64_t v = int64_t(idx[off[1]]);
    o[off[0]] = (v >= 0 && v < limit) ? src[off[2] + v * step] : T(0);
  }
};

template <class T>
using seg_acc_t = std::conditional_t<std::is_integral_v<T>, int64_t, acc_t<T>>;

template <class T, class Acc>
__device__ __forceinline__ void segment_store(T* o, Acc s, bool accumulate) {
  if constexpr (std::is_integral_v<T>) *o = accumulate ? T(int64_t(*o) + s) : T(s);
  else *o = accumulate ? narrow<T>(acc_t<T>(widen(*o)) + s) : narrow<T>(s);
}

template <class T>
__global__ void segment_rows_kernel(SegmentRowsArgs a) {
  using Acc = seg_acc_t<T>;
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  for (int64_t task = blockIdx.x; task < a.O * a.R; task += gridDim.x) {
    const int64_t o = task / a.R, r = task - o * a.R;
    T* orow = out + (o * a.R + r) * a.I;
    const int64_t b = a.offsets[r], n = a.offsets[r + 1] - b;
    if (n == 0) {
      if (!a.accumulate)
        for (int64_t i = threadIdx.x; i < a.I; i += blockDim.x) orow[i] = T(0);
      continue;
    }
    const T* sbase = src + o * a.T * a.I;
    for (int64_t i = threadIdx.x; i < a.I; i += blockDim.x) {
      const Acc s = segment_sum<Acc>(a.perm + b, n, a.T, a.chunks,
                                     [&](int64_t t) { return Acc(widen(sbase[t * a.I + i])); });
      segment_store(orow + i, s, a.accumulate);
    }
  }
}

template <class T>
__global__ void segment_tasks_kernel(SegmentTasksArgs a) {
  using Acc = seg_acc_t<T>;
  const T* src = static_cast<const T*>(a.src);
  T* out = static_cast<T*>(a.out);
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < a.tasks; k += int64_t(gridDim.x) * blockDim.x) {
    const int64_t b = a.begin[k], n = a.begin[k + 1] - b;
    const T* sb = src + a.src_base[k];
    const Acc s =
        segment_sum<Acc>(a.pos + b, n, a.T, a.chunks, [&](int64_t t) { return Acc(widen(sb[t * a.src_stride])); });
    segment_store(out + a.out_off[k], s, a.accumulate);
  }
}

template <class T>
__global__ void triangle_kernel(TriangleArgs a, const T* x, T* out) {
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < a.numel; e += int64_t(gridDim.x) * blockDim.x) {
    int64_t rem = e, xo = 0, oo = 0, i = 0, j = 0;
    for (int d = a.ndim - 1; d >= 0; --d) {
      const int64_t c = rem % a.size[d];
      rem /= a.size[d];
      xo += c * a.xstride[d];
      oo += c * a.ostride[d];
      if (d == a.ndim - 1) j = c;
      if (d == a.ndim - 2) i = c;
    }
    const int64_t edge = i + a.k;
    const bool keep = a.upper ? j >= edge : j <= edge;
    out[oo] = keep ? x[xo] : T(0);
  }
}

}  // namespace

void launch_index_bounds(DType index_dtype, const ElemGeometry<1>& g, const void* index, int64_t limit, int64_t* bad,
                         cudaStream_t s) {
  dispatch_index(index_dtype, "index_bounds", [&](auto tag) {
    using I = typename decltype(tag)::type;
    launch_elementwise<1>(g, BoundsFn<I>{static_cast<const I*>(index), limit, bad, g.numel}, s, "index_bounds");
  });
}

void launch_gather(DType dtype, DType index_dtype, const ElemGeometry<3>& g, void* out, const void* index,
                   const void* src, int64_t step, int64_t limit, cudaStream_t s) {
  dispatch_all(dtype, "gather", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index(index_dtype, "gather", [&](auto itag) {
      using I = typename decltype(itag)::type;
      launch_elementwise<3>(g,
                            GatherFn<T, I>{static_cast<T*>(out), static_cast<const I*>(index),
                                           static_cast<const T*>(src), step, limit},
                            s, "gather");
    });
  });
}

void launch_segment_rows(DType dtype, const SegmentRowsArgs& a, cudaStream_t s) {
  if (a.O == 0 || a.R == 0 || a.I == 0) return;
  dispatch_numeric(dtype, "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t tasks = a.O * a.R;
    const int threads = a.I >= 128 ? 128 : 32;
    segment_rows_kernel<T><<<unsigned(tasks < kMaxBlocks ? tasks : kMaxBlocks), threads, 0, s>>>(a);
    TESSEL_CUDA_CHECK_LAUNCH("index_add");
  });
}

void launch_segment_tasks(DType dtype, const SegmentTasksArgs& a, cudaStream_t s) {
  if (a.tasks == 0) return;
  dispatch_numeric(dtype, "scatter_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    segment_tasks_kernel<T><<<grid_blocks(a.tasks), kThreads, 0, s>>>(a);
    TESSEL_CUDA_CHECK_LAUNCH("scatter_add");
  });
}

void launch_triangle(DType dtype, const TriangleArgs& a, const void* x, void* out, cudaStream_t s) {
  if (a.numel == 0) return;
  dispatch_all(dtype, a.upper ? "triu" : "tril", [&](auto tag) {
    using T = typename decltype(tag)::type;
    triangle_kernel<T><<<grid_blocks(a.numel), kThreads, 0, s>>>(a, static_cast<const T*>(x), static_cast<T*>(out));
    TESSEL_CUDA_CHECK_LAUNCH(a.upper ? "triu" : "tril");
  });
}

}  // namespace tessel::kernels::cuda

// ---- KernelTable adapters: register the CUDA indexing kernels.
//
// The scatter-adds group positions by destination on the host: the indices
// are copied to the host (one synchronisation per call), sorted by
// (destination, position) -- a unique order, hence deterministic -- and the
// groups uploaded; the sums themselves run on the GPU in the canonical order.
// Shapes and index dtypes are the op's to check (autograd/ops/indexing.cc);
// the checks left here are on index values, read on the host anyway: data a
// Meta run never sees, and out of range they would write out of bounds.
namespace tessel::kernels::cuda {
namespace {

// The indices as host int64 values in row-major order.
std::vector<int64_t> indices_on_host(const CudaCall& call, const Tensor& index) {
  Tensor c = scratch(call, index.shape(), DType::Int64);
  copy(call.dev(), index, c);
  std::vector<int64_t> v(size_t(index.numel()));
  if (!v.empty()) read_back(call, c, v.data(), v.size() * sizeof(int64_t));
  return v;
}

Tensor upload_vec(const CudaCall& call, const std::vector<int64_t>& v) {
  return upload(call, v.data(), Dims{int64_t(v.size())}, DType::Int64);
}

void index_bounds_cuda(const Tensor& index, int64_t limit, int64_t* bad_pos, int64_t* bad_value) {
  CudaCall call("index_bounds", {&index});
  *bad_pos = -1;
  *bad_value = 0;
  if (index.numel() == 0) return;
  Tensor idx = index;
  if (!index.is_contiguous()) {
    idx = scratch(call, index.shape(), index.dtype());
    copy(call.dev(), index, idx);
  }
  const int64_t none = std::numeric_limits<int64_t>::max();
  Tensor bad = upload(call, &none, Dims{}, DType::Int64);
  launch_index_bounds(idx.dtype(), make_elem_geometry<1>({&idx}), idx.raw_data(), limit,
                      static_cast<int64_t*>(bad.raw_data()), call.stream());
  int64_t pos = none;
  read_back(call, bad, &pos, sizeof(pos));
  if (pos == none) return;
  *bad_pos = pos;
  Tensor flat = raw::try_view(idx, Dims{idx.numel()});
  Tensor one = scratch(call, Dims{1}, DType::Int64);
  copy(call.dev(), raw::narrow(flat, 0, pos, 1), one);
  read_back(call, one, bad_value, sizeof(int64_t));
}

void gather_strided_cuda(const Tensor& src, const Tensor& index, int64_t step, int64_t limit, const Tensor& out) {
  CudaCall call("gather", {&src, &index, &out});
  launch_gather(out.dtype(), index.dtype(), make_elem_geometry<3>({&out, &index, &src}), out.raw_data(),
                index.raw_data(), src.raw_data(), step, limit, call.stream());
}

void index_add_cuda(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, int chunks,
                    bool accumulate) {
  CudaCall call("index_add", {&out, &index, &src});
  const int d = wrap_dim(dim, out.dim(), "index_add");
  SegmentRowsArgs a;
  a.T = index.numel();
  a.O = 1;
  a.I = 1;
  for (int e = 0; e < d; ++e) a.O *= out.shape()[e];
  for (int e = d + 1; e < out.dim(); ++e) a.I *= out.shape()[e];
  a.R = out.shape()[d];
  if (a.O == 0 || a.R == 0 || a.I == 0) return;
  // Stable counting sort of positions by destination (on the host).
  const std::vector<int64_t> dest = indices_on_host(call, index);
  std::vector<int64_t> offsets(size_t(a.R + 1), 0), perm(size_t(a.T));
  for (int64_t t = 0; t < a.T; ++t) {
    const int64_t r = dest[size_t(t)];
    TESSEL_CHECK(r >= 0 && r < a.R, "index_add", "index {} at position {} is out of range [0, {})", r, t, a.R);
    ++offsets[size_t(r + 1)];
  }
  for (int64_t r = 0; r < a.R; ++r) offsets[size_t(r + 1)] += offsets[size_t(r)];
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t t = 0; t < a.T; ++t) perm[size_t(next[size_t(dest[size_t(t)])]++)] = t;
  Tensor off_d = upload_vec(call, offsets);
  Tensor perm_d = a.T > 0 ? upload_vec(call, perm) : Tensor();
  a.chunks = chunks;
  a.accumulate = accumulate;
  a.offsets = static_cast<const int64_t*>(off_d.raw_data());
  a.perm = a.T > 0 ? static_cast<const int64_t*>(perm_d.raw_data()) : nullptr;
  a.src = src.raw_data();
  a.out = out.raw_data();
  launch_segment_rows(out.dtype(), a, call.stream());
}

void scatter_add_cuda(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, int chunks,
                      bool accumulate) {
  CudaCall call("scatter_add", {&out, &index, &src});
  const int d = wrap_dim(dim, out.dim(), "scatter_add");
  if (!accumulate) fill(out.device(), out, Scalar(0));
  if (index.numel() == 0) return;
  const int nd = index.dim();
  const int64_t Tn = index.shape()[d], R = out.shape()[d];
  const std::vector<int64_t> idx = indices_on_host(call, index);  // row-major over index's shape
  // Lines along d: every coordinate of the other dims, row-major.
  int64_t lines = 1;
  for (int e = 0; e < nd; ++e)
    if (e != d) lines *= index.shape()[e];
  const int64_t istride_d = [&] {  // row-major stride of d in the contiguous host copy
    int64_t s = 1;
    for (int e = nd - 1; e > d; --e) s *= index.shape()[e];
    return s;
  }();
  std::vector<int64_t> begin{0}, pos, src_base, out_off;
  std::vector<std::pair<int64_t, int64_t>> pairs(static_cast<size_t>(Tn));
  for (int64_t line = 0; line < lines; ++line) {
    // Coordinates of this line (dim d = 0) -> offsets in the host copy, src and out.
    int64_t rem = line, host_off = 0, soff = 0, ooff = 0, hs = 1;
    for (int e = nd - 1; e >= 0; --e) {
      if (e == d) {
        hs *= index.shape()[e];
        continue;
      }
      const int64_t c = rem % index.shape()[e];
      rem /= index.shape()[e];
      host_off += c * hs;
      soff += c * src.strides()[e];
      ooff += c * out.strides()[e];
      hs *= index.shape()[e];
    }
    for (int64_t t = 0; t < Tn; ++t) {
      const int64_t v = idx[size_t(host_off + t * istride_d)];
      TESSEL_CHECK(v >= 0 && v < R, "scatter_add", "index {} is out of range [0, {})", v, R);
      pairs[size_t(t)] = {v, t};
    }
    std::sort(pairs.begin(), pairs.end());  // (destination, t) pairs are distinct: one order only
    for (int64_t k = 0; k < Tn;) {
      const int64_t r = pairs[size_t(k)].first;
      int64_t e = k;
      while (e < Tn && pairs[size_t(e)].first == r) pos.push_back(pairs[size_t(e++)].second);
      begin.push_back(int64_t(pos.size()));
      src_base.push_back(soff);
      out_off.push_back(ooff + r * out.strides()[d]);
      k = e;
    }
  }
  Tensor begin_d = upload_vec(call, begin), pos_d = upload_vec(call, pos), sb_d = upload_vec(call, src_base),
         oo_d = upload_vec(call, out_off);
  SegmentTasksArgs a;
  a.tasks = int64_t(src_base.size());
  a.T = Tn;
  a.src_stride = src.strides()[d];
  a.chunks = chunks;
  a.accumulate = accumulate;
  a.begin = static_cast<const int64_t*>(begin_d.raw_data());
  a.pos = static_cast<const int64_t*>(pos_d.raw_data());
  a.src_base = static_cast<const int64_t*>(sb_d.raw_data());
  a.out_off = static_cast<const int64_t*>(oo_d.raw_data());
  a.src = src.raw_data();
  a.out = out.raw_data();
  // In assign mode out was zeroed above; every hit element is assigned its sum
  // (accumulating into the zero would turn a -0 sum into +0, unlike the CPU).
  launch_segment_tasks(out.dtype(), a, call.stream());
}

void triangle_cuda(const Tensor& x, int64_t k, bool upper, const Tensor& out) {
  const char* name = upper ? "triu" : "tril";
  CudaCall call(name, {&x, &out});
  TriangleArgs a;
  a.ndim = x.dim();
  a.numel = x.numel();
  for (int d = 0; d < x.dim(); ++d) {
    a.size[d] = x.shape()[d];
    a.xstride[d] = x.strides()[d];
    a.ostride[d] = out.strides()[d];
  }
  a.k = k;
  a.upper = upper;
  launch_triangle(x.dtype(), a, x.raw_data(), out.raw_data(), call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(index_bounds, DeviceType::CUDA, index_bounds_cuda);
TESSEL_REGISTER_KERNEL(gather_strided, DeviceType::CUDA, gather_strided_cuda);
TESSEL_REGISTER_KERNEL(index_add, DeviceType::CUDA, index_add_cuda);
TESSEL_REGISTER_KERNEL(scatter_add, DeviceType::CUDA, scatter_add_cuda);
TESSEL_REGISTER_KERNEL(triangle, DeviceType::CUDA, triangle_cuda);

}  // namespace tessel::kernels::cuda
