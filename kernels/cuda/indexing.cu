// CUDA indexing kernels: bounds checks, indexed loads, the deterministic
// segmented scatter-adds, triangular masks.
//
// The scatter-adds follow kernels/cpu/segment_sum.h bit for bit without
// atomics: the host groups source positions by destination (ascending t);
// each destination element then walks its own positions, adding each into
// lane (t - chunk_begin) % 8 of its chunk, closes a chunk with the lane tree
// and folds the chunk values with tree_fold.h (skipped chunks are +0, exact
// because a canonical partial sum is never -0).
#include <cstdint>
#include <type_traits>

#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/indexing_launch.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/segment.h"
#include "runtime/numerics.h"

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
