// CUDA LayerNorm / RMSNorm in the order of kernels/norm.h (the CPU's bits for
// float32): one block per row for the forward pass and for dx (row sums with
// block_canonical_reduce), and the weight/bias gradients as canonical sums
// down the M rows: one thread per (column, chunk) with its 8 lanes in
// registers, then a tree over the V chunk values of each column.
#include "kernels/cuda/canonical.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/norm_launch.h"

namespace tessel::kernels::cuda {
namespace {

template <class T>
__global__ void norm_forward_kernel(NormArgs a) {
  using C = acc_t<T>;
  C* smem = shared_array<C>();
  const int64_t n = a.n;
  const C n_c = C(n), eps = C(a.eps);
  const T* w = static_cast<const T*>(a.weight);
  const T* bias = static_cast<const T*>(a.bias);
  for (int64_t r = blockIdx.x; r < a.m; r += gridDim.x) {
    const T* xr = static_cast<const T*>(a.x) + r * n;
    T* yr = static_cast<T*>(a.y) + r * n;
    auto xl = [&](int64_t t) { return C(widen(xr[t])); };
    C mu = C(0), rs;
    if (a.rms) {
      const C ss = block_canonical_reduce<C>(
          n, a.chunks, C(0), [&](int64_t t) { return xl(t) * xl(t); }, SumCombine<C>(), smem);
      rs = C(1) / sqrt(ss / n_c + eps);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        C h = xl(i) * rs;
        if (w) h = h * C(widen(w[i]));
        yr[i] = narrow<T>(h);
      }
    } else {
      mu = block_canonical_reduce<C>(n, a.chunks, C(0), xl, SumCombine<C>(), smem) / n_c;
      const C var = block_canonical_reduce<C>(
          n, a.chunks, C(0), [&](int64_t t) { return (xl(t) - mu) * (xl(t) - mu); }, SumCombine<C>(), smem);
      rs = C(1) / sqrt(var / n_c + eps);
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        C h = (xl(i) - mu) * rs;
        if (w) h = h * C(widen(w[i]));
        if (bias) h = h + C(widen(bias[i]));
        yr[i] = narrow<T>(h);
      }
    }
    if (threadIdx.x == 0) {
      if (!a.rms) static_cast<C*>(a.mean)[r] = mu;
      static_cast<C*>(a.rstd)[r] = rs;
    }
  }
}

template <class T>
__device__ __forceinline__ acc_t<T> xhat_of(const NormArgs& a, int64_t t, int64_t j) {
  using C = acc_t<T>;
  const C xv = C(widen(static_cast<const T*>(a.x)[t * a.n + j]));
  const C rs = static_cast<const C*>(a.rstd)[t];
  if (a.rms) return xv * rs;
  return (xv - static_cast<const C*>(a.mean)[t]) * rs;
}

template <class T>
__global__ void norm_dx_kernel(NormArgs a) {
  using C = acc_t<T>;
  C* smem = shared_array<C>();
  const int64_t n = a.n;
  const C n_c = C(n);
  const T* w = static_cast<const T*>(a.weight);
  for (int64_t r = blockIdx.x; r < a.m; r += gridDim.x) {
    const T* gr = static_cast<const T*>(a.g) + r * n;
    T* dr = static_cast<T*>(a.dx) + r * n;
    const C rs = static_cast<const C*>(a.rstd)[r];
    auto gw = [&](int64_t i) { return w ? C(widen(gr[i])) * C(widen(w[i])) : C(widen(gr[i])); };
    const C bb = block_canonical_reduce<C>(
                     n, a.chunks, C(0), [&](int64_t i) { return gw(i) * xhat_of<T>(a, r, i); }, SumCombine<C>(),
                     smem) /
                 n_c;
    if (a.rms) {
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dr[i] = narrow<T>((gw(i) - xhat_of<T>(a, r, i) * bb) * rs);
    } else {
      const C aa = block_canonical_reduce<C>(n, a.chunks, C(0), gw, SumCombine<C>(), smem) / n_c;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
        dr[i] = narrow<T>(((gw(i) - aa) - xhat_of<T>(a, r, i) * bb) * rs);
    }
  }
}

// work[0][c][j] = chunk c of sum_t g_tj * xhat_tj; work[1][c][j] = chunk c of sum_t g_tj.
template <class T>
__global__ void norm_param_chunks_kernel(NormArgs a) {
  using C = acc_t<T>;
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const int c = blockIdx.y * blockDim.y + threadIdx.y;
  if (j >= a.n || c >= a.chunks) return;
  const T* g = static_cast<const T*>(a.g);
  const int64_t b = numerics::chunk_begin(a.m, a.chunks, c), e = numerics::chunk_end(a.m, a.chunks, c);
  C* work = static_cast<C*>(a.work);
  const int64_t plane = int64_t(a.chunks) * a.n;
  if (a.dweight)
    work[int64_t(c) * a.n + j] = chunk_reduce_lanes<C>(
        b, e, C(0), [&](int64_t t) { return C(widen(g[t * a.n + j])) * xhat_of<T>(a, t, j); }, SumCombine<C>());
  if (a.dbias)
    work[plane + int64_t(c) * a.n + j] =
        chunk_reduce_lanes<C>(b, e, C(0), [&](int64_t t) { return C(widen(g[t * a.n + j])); }, SumCombine<C>());
}

template <class T>
__global__ void norm_param_tree_kernel(NormArgs a) {
  using C = acc_t<T>;
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= a.n) return;
  C* work = static_cast<C*>(a.work);
  const int64_t plane = int64_t(a.chunks) * a.n;
  if (a.dweight)
    static_cast<T*>(a.dweight)[j] = narrow<T>(tree_combine_strided(work + j, a.n, a.chunks, SumCombine<C>()));
  if (a.dbias)
    static_cast<T*>(a.dbias)[j] = narrow<T>(tree_combine_strided(work + plane + j, a.n, a.chunks, SumCombine<C>()));
}

unsigned row_blocks(int64_t rows) { return unsigned(rows < kMaxBlocks ? rows : kMaxBlocks); }

}  // namespace

size_t norm_workspace_bytes(DType dtype, int64_t n, int chunks) {
  return size_t(2) * size_t(chunks) * size_t(n) * (dtype == DType::Float64 ? 8 : 4);
}

void launch_norm_forward(DType dtype, const NormArgs& a, cudaStream_t s) {
  if (a.m == 0 || a.n == 0) return;
  const char* op = a.rms ? "rms_norm" : "layer_norm";
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    norm_forward_kernel<T><<<row_blocks(a.m), row_block_threads(a.chunks), size_t(a.chunks) * sizeof(acc_t<T>), s>>>(a);
    TESSEL_CUDA_CHECK_LAUNCH(op);
  });
}

void launch_norm_backward(DType dtype, const NormArgs& a, cudaStream_t s) {
  if (a.n == 0) return;
  const char* op = a.rms ? "rms_norm_backward" : "layer_norm_backward";
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (a.dx && a.m > 0) {
      norm_dx_kernel<T><<<row_blocks(a.m), row_block_threads(a.chunks), size_t(a.chunks) * sizeof(acc_t<T>), s>>>(a);
      TESSEL_CUDA_CHECK_LAUNCH(op);
    }
    if (a.dweight || a.dbias) {
      const dim3 block(32, 8);
      const dim3 grid(unsigned(ceil_div(a.n, 32)), unsigned(ceil_div(a.chunks, 8)));
      norm_param_chunks_kernel<T><<<grid, block, 0, s>>>(a);
      TESSEL_CUDA_CHECK_LAUNCH(op);
      norm_param_tree_kernel<T><<<unsigned(ceil_div(a.n, 256)), 256, 0, s>>>(a);
      TESSEL_CUDA_CHECK_LAUNCH(op);
    }
  });
}

}  // namespace tessel::kernels::cuda
