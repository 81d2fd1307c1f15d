// CUDA reductions: sum/max/min in the canonical order (canonical.cuh) for
// floating types -- the bits of kernels/cpu/reduce.cc -- and exact integer
// reductions; arg max/min with the CPU's first-occurrence rule.
#include <cstddef>
#include <cstdint>
#include <cuda_runtime.h>
#include <type_traits>

#include "kernels/cuda/call.h"
#include "kernels/cuda/canonical.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/geometry.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/launch.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

// ---- launch interface: what the adapters at the end call ----
namespace tessel::kernels::cuda {

// Scratch bytes launch_reduce needs for (path, dtype, geometry, V): the column
// path keeps V chunk values per output.
size_t reduce_workspace_bytes(ReducePath path, DType dtype, const ReduceGeometry& g, int chunks);

// out = reduce(x) in the canonical order (floating) or exactly (integer/bool;
// sums are int64). g.n > 0 and g.outputs > 0.
void launch_reduce(ReduceOp op, DType dtype, ReducePath path, const ReduceGeometry& g, const void* x, void* out,
                   int chunks, void* work, cudaStream_t stream);

// out[row] = index of the first max (min) along the row; NaN counts as the
// maximum and the minimum (first NaN wins). Operands: x, out.
void launch_arg_reduce(DType dtype, const RowGeometry<2>& g, const void* x, int64_t* out, bool is_max,
                       cudaStream_t stream);

}  // namespace tessel::kernels::cuda

namespace tessel::kernels::cuda {
namespace {

template <class Acc, ReduceOp Op>
struct Combine {
  __device__ __forceinline__ Acc operator()(Acc a, Acc b) const {
    if constexpr (Op == ReduceOp::Sum) return a + b;
    else if constexpr (Op == ReduceOp::Max) return MaxCombine<Acc>()(a, b);
    else return MinCombine<Acc>()(a, b);
  }
};

template <class Acc, ReduceOp Op>
__device__ __forceinline__ Acc identity_of() {
  if constexpr (Op == ReduceOp::Sum) return Acc(0);
  else if constexpr (Op == ReduceOp::Max) return Acc(-INFINITY);
  else return Acc(INFINITY);
}

// ---- floating: row path (one block per output) ----------------------------------------
template <class T, ReduceOp Op>
__global__ void reduce_row_kernel(ReduceGeometry g, const T* x, T* out, int V) {
  using Acc = acc_t<T>;
  Acc* smem = shared_array<Acc>();
  for (int64_t o = blockIdx.x; o < g.outputs; o += gridDim.x) {
    int64_t xo, oo;
    reduce_output_offsets(g, o, &xo, &oo);
    const T* xb = x + xo;
    const Acc r = block_canonical_reduce<Acc>(
        g.n, V, identity_of<Acc, Op>(), [&](int64_t t) { return Acc(widen(xb[reduce_element_offset(g, t)])); },
        Combine<Acc, Op>(), smem);
    if (threadIdx.x == 0) out[oo] = narrow<T>(r);
  }
}

// ---- floating: column path (thread per (output, chunk), then a tree per output) -------
template <class T, ReduceOp Op>
__global__ void reduce_col_chunks_kernel(ReduceGeometry g, const T* x, acc_t<T>* work, int V) {
  using Acc = acc_t<T>;
  const int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int c = blockIdx.y * blockDim.y + threadIdx.y;
  if (o >= g.outputs || c >= V) return;
  int64_t xo, oo;
  reduce_output_offsets(g, o, &xo, &oo);
  const T* xb = x + xo;
  const int64_t b = numerics::chunk_begin(g.n, V, c), e = numerics::chunk_end(g.n, V, c);
  work[int64_t(c) * g.outputs + o] = chunk_reduce_lanes<Acc>(
      b, e, identity_of<Acc, Op>(), [&](int64_t t) { return Acc(widen(xb[reduce_element_offset(g, t)])); },
      Combine<Acc, Op>());
}

template <class T, ReduceOp Op>
__global__ void reduce_col_tree_kernel(ReduceGeometry g, acc_t<T>* work, T* out, int V) {
  const int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (o >= g.outputs) return;
  int64_t xo, oo;
  reduce_output_offsets(g, o, &xo, &oo);
  out[oo] = narrow<T>(tree_combine_strided(work + o, g.outputs, V, Combine<acc_t<T>, Op>()));
}

template <class T, ReduceOp Op>
void reduce_float(ReducePath path, const ReduceGeometry& g, const void* x, void* out, int V, void* work,
                  cudaStream_t s) {
  using Acc = acc_t<T>;
  if (path == ReducePath::Row) {
    const int threads = row_block_threads(V);
    const unsigned blocks = unsigned(g.outputs < kMaxBlocks ? g.outputs : kMaxBlocks);
    reduce_row_kernel<T, Op><<<blocks, threads, size_t(V) * sizeof(Acc), s>>>(g, static_cast<const T*>(x),
                                                                              static_cast<T*>(out), V);
    TESSEL_CUDA_CHECK_LAUNCH("reduce");
    return;
  }
  const dim3 block(32, 8);
  const dim3 grid(unsigned(ceil_div(g.outputs, 32)), unsigned(ceil_div(V, 8)));
  reduce_col_chunks_kernel<T, Op><<<grid, block, 0, s>>>(g, static_cast<const T*>(x), static_cast<Acc*>(work), V);
  TESSEL_CUDA_CHECK_LAUNCH("reduce");
  reduce_col_tree_kernel<T, Op><<<unsigned(ceil_div(g.outputs, 256)), 256, 0, s>>>(g, static_cast<Acc*>(work),
                                                                                   static_cast<T*>(out), V);
  TESSEL_CUDA_CHECK_LAUNCH("reduce");
}

// ---- integer / bool: exact (order-free) --------------------------------------------------
template <class T, ReduceOp Op>
__global__ void reduce_int_kernel(ReduceGeometry g, const T* x, std::conditional_t<Op == ReduceOp::Sum, int64_t, T>* out) {
  using Out = std::conditional_t<Op == ReduceOp::Sum, int64_t, T>;
  __shared__ Out part[256];
  for (int64_t o = blockIdx.x; o < g.outputs; o += gridDim.x) {
    int64_t xo, oo;
    reduce_output_offsets(g, o, &xo, &oo);
    const T* xb = x + xo;
    Out acc = Op == ReduceOp::Sum ? Out(0) : Out(xb[0]);
    for (int64_t t = threadIdx.x; t < g.n; t += blockDim.x) {
      const T v = xb[reduce_element_offset(g, t)];
      if constexpr (Op == ReduceOp::Sum) acc = Out(uint64_t(acc) + uint64_t(int64_t(v)));  // wraps like the CPU
      else if constexpr (Op == ReduceOp::Max) acc = v > acc ? v : acc;
      else acc = v < acc ? v : acc;
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
      if (int(threadIdx.x) < w) {
        const Out a = part[threadIdx.x], b = part[threadIdx.x + w];
        if constexpr (Op == ReduceOp::Sum) part[threadIdx.x] = Out(uint64_t(a) + uint64_t(b));
        else if constexpr (Op == ReduceOp::Max) part[threadIdx.x] = b > a ? b : a;
        else part[threadIdx.x] = b < a ? b : a;
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) out[oo] = part[0];
    __syncthreads();
  }
}

template <class T, ReduceOp Op>
void reduce_int(const ReduceGeometry& g, const void* x, void* out, cudaStream_t s) {
  using Out = std::conditional_t<Op == ReduceOp::Sum, int64_t, T>;
  const unsigned blocks = unsigned(g.outputs < kMaxBlocks ? g.outputs : kMaxBlocks);
  reduce_int_kernel<T, Op><<<blocks, 256, 0, s>>>(g, static_cast<const T*>(x), static_cast<Out*>(out));
  TESSEL_CUDA_CHECK_LAUNCH("reduce");
}

// ---- arg max / min -------------------------------------------------------------------------
template <class C>
struct ArgBest {
  C v;
  int64_t i;
};

// Is candidate b preferred over a? NaN first (lowest index among NaNs), then
// the better value, ties to the lower index -- the CPU's ascending scan.
template <class C>
__device__ __forceinline__ bool arg_prefer(const ArgBest<C>& a, const ArgBest<C>& b, bool is_max) {
  const bool an = a.v != a.v, bn = b.v != b.v;
  if (an || bn) return an && bn ? b.i < a.i : bn;
  if (is_max ? b.v > a.v : b.v < a.v) return true;
  if (is_max ? a.v > b.v : a.v < b.v) return false;
  return b.i < a.i;
}

template <class T>
__global__ void arg_reduce_kernel(RowGeometry<2> g, const T* x, int64_t* out, bool is_max) {
  using C = acc_t<T>;
  __shared__ C sv[256];
  __shared__ int64_t si[256];
  for (int64_t r = blockIdx.x; r < g.rows; r += gridDim.x) {
    const T* xr = x + row_offset(g, r, 0);
    const int64_t xs = g.inner_stride[0];
    ArgBest<C> best{C(widen(xr[0])), 0};
    for (int64_t t = threadIdx.x; t < g.n; t += blockDim.x) {
      const ArgBest<C> cand{C(widen(xr[t * xs])), t};
      if (arg_prefer(best, cand, is_max)) best = cand;
    }
    sv[threadIdx.x] = best.v;
    si[threadIdx.x] = best.i;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
      if (int(threadIdx.x) < w) {
        const ArgBest<C> a{sv[threadIdx.x], si[threadIdx.x]}, b{sv[threadIdx.x + w], si[threadIdx.x + w]};
        if (arg_prefer(a, b, is_max)) {
          sv[threadIdx.x] = b.v;
          si[threadIdx.x] = b.i;
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) out[row_offset(g, r, 1)] = si[0];
    __syncthreads();
  }
}

}  // namespace

size_t reduce_workspace_bytes(ReducePath path, DType dtype, const ReduceGeometry& g, int chunks) {
  if (path != ReducePath::Column || !is_floating(dtype)) return 0;
  return size_t(chunks) * size_t(g.outputs) * (dtype == DType::Float64 ? 8 : 4);
}

void launch_reduce(ReduceOp op, DType dtype, ReducePath path, const ReduceGeometry& g, const void* x, void* out,
                   int V, void* work, cudaStream_t s) {
  dispatch_all(dtype, "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T> || is_half_v<T>) {
      switch (op) {
        case ReduceOp::Sum: return reduce_float<T, ReduceOp::Sum>(path, g, x, out, V, work, s);
        case ReduceOp::Max: return reduce_float<T, ReduceOp::Max>(path, g, x, out, V, work, s);
        case ReduceOp::Min: return reduce_float<T, ReduceOp::Min>(path, g, x, out, V, work, s);
      }
    } else {
      switch (op) {
        case ReduceOp::Sum: return reduce_int<T, ReduceOp::Sum>(g, x, out, s);
        case ReduceOp::Max: return reduce_int<T, ReduceOp::Max>(g, x, out, s);
        case ReduceOp::Min: return reduce_int<T, ReduceOp::Min>(g, x, out, s);
      }
    }
  });
}

void launch_arg_reduce(DType dtype, const RowGeometry<2>& g, const void* x, int64_t* out, bool is_max,
                       cudaStream_t s) {
  if (g.rows == 0 || g.n == 0) return;
  dispatch_all(dtype, is_max ? "argmax" : "argmin", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const unsigned blocks = unsigned(g.rows < kMaxBlocks ? g.rows : kMaxBlocks);
    arg_reduce_kernel<T><<<blocks, 256, 0, s>>>(g, static_cast<const T*>(x), out, is_max);
    TESSEL_CUDA_CHECK_LAUNCH(is_max ? "argmax" : "argmin");
  });
}

}  // namespace tessel::kernels::cuda

// ---- KernelTable adapters: register the CUDA reductions.
namespace tessel::kernels::cuda {
namespace {

void reduce_cuda(ReduceOp op, const Tensor& x, const Tensor& out, int v) {
  CudaCall call("reduce", {&x, &out});
  if (out.numel() == 0) return;
  if (x.numel() == 0) {  // empty reduction: the identity (sum only; max/min are rejected by the op layer)
    fill(out.device(), out, Scalar(0));
    return;
  }
  const ReduceGeometry g = make_reduce_geometry(x.shape(), x.strides(), out.shape(), out.strides());
  const ReducePath path = choose_reduce_path(g);
  const size_t ws = reduce_workspace_bytes(path, x.dtype(), g, v);
  Tensor work = ws ? scratch(call, Dims{int64_t(ws)}, DType::Bool) : Tensor();
  launch_reduce(op, x.dtype(), path, g, x.raw_data(), out.raw_data(), v, ws ? work.raw_data() : nullptr,
                call.stream());
}

void arg_reduce_cuda(const Tensor& x, int64_t dim, bool is_max, const Tensor& out) {
  const char* name = is_max ? "argmax" : "argmin";
  CudaCall call(name, {&x, &out});
  const int d = wrap_dim(dim, x.dim(), name);
  launch_arg_reduce(x.dtype(), make_row_geometry<2>(x.shape(), d, {&x.strides(), &out.strides()}), x.raw_data(),
                    static_cast<int64_t*>(out.raw_data()), is_max, call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(reduce, DeviceType::CUDA, reduce_cuda);
TESSEL_REGISTER_KERNEL(arg_reduce, DeviceType::CUDA, arg_reduce_cuda);

}  // namespace tessel::kernels::cuda
