// CUDA LayerNorm / RMSNorm in the order of kernels/norm.h (the CPU's bits for
// float32): one block per row for the forward pass and for dx (row sums with
// block_canonical_reduce), and the weight/bias gradients as canonical sums
// down the M rows: one thread per (column, chunk) with its 8 lanes in
// registers, then a tree over the V chunk values of each column.
#include <cstdint>
#include <cuda_runtime.h>

#include "kernels/cuda/call.h"
#include "kernels/cuda/canonical.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/launch.h"
#include "kernels/norm.h"
#include "runtime/dtype.h"

// ---- launch interface: what the adapters at the end call ----
// Layout (kernels/norm.h): x, g, y, dx contiguous [M, N]; weight,
// bias, dweight, dbias contiguous [N] (null: absent); mean, rstd [M] in the
// compute type.
namespace tessel::kernels::cuda {

struct NormArgs {
  int64_t m = 0, n = 0;
  bool rms = false;
  double eps = 0;
  int chunks = 16;
  const void* x = nullptr;
  const void* g = nullptr;       // backward
  const void* weight = nullptr;  // may be null
  const void* bias = nullptr;    // may be null (forward, layer norm)
  void* y = nullptr;             // forward
  void* mean = nullptr;          // layer norm (forward writes, backward reads)
  void* rstd = nullptr;
  void* dx = nullptr;       // backward, may be null
  void* dweight = nullptr;  // backward, may be null
  void* dbias = nullptr;    // backward, may be null
  void* work = nullptr;     // backward with dweight/dbias: norm_workspace_bytes
};

void launch_norm_forward(DType dtype, const NormArgs& a, cudaStream_t stream);
void launch_norm_backward(DType dtype, const NormArgs& a, cudaStream_t stream);
// Scratch for the column sums of the weight/bias gradients: 2 x V x N values.
size_t norm_workspace_bytes(DType dtype, int64_t n, int chunks);

}  // namespace tessel::kernels::cuda

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

// ---- KernelTable adapters: register the CUDA LayerNorm / RMSNorm kernels.
namespace tessel::kernels::cuda {
namespace {

void* ptr(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

NormArgs args(const Tensor& x, int v, bool rms) {
  NormArgs a;
  a.m = x.shape()[0];
  a.n = x.shape()[1];
  a.rms = rms;
  a.chunks = v;
  a.x = x.raw_data();
  return a;
}

void layer_norm_forward_cuda(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                             const Tensor& mean, const Tensor& rstd, int v) {
  CudaCall call("layer_norm", {&x, &w, &b, &y, &mean, &rstd});
  if (x.numel() == 0) return;
  NormArgs a = args(x, v, false);
  a.eps = eps;
  a.weight = ptr(w);
  a.bias = ptr(b);
  a.y = y.raw_data();
  a.mean = mean.raw_data();
  a.rstd = rstd.raw_data();
  launch_norm_forward(x.dtype(), a, call.stream());
}

void norm_backward(const char* op, bool rms, const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& mean,
                   const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db, int v) {
  CudaCall call(op, {&g, &x, &w, &mean, &rstd, &dx, &dw, &db});
  if (x.shape()[1] == 0) return;
  NormArgs a = args(x, v, rms);
  a.g = g.raw_data();
  a.weight = ptr(w);
  a.mean = ptr(mean);
  a.rstd = ptr(rstd);
  a.dx = ptr(dx);
  a.dweight = ptr(dw);
  a.dbias = ptr(db);
  Tensor work;
  if (dw.defined() || db.defined()) {
    work = scratch(call, Dims{int64_t(norm_workspace_bytes(x.dtype(), a.n, v))}, DType::Bool);
    a.work = work.raw_data();
  }
  launch_norm_backward(x.dtype(), a, call.stream());
}

void layer_norm_backward_cuda(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db, int v) {
  norm_backward("layer_norm_backward", false, g, x, w, mean, rstd, dx, dw, db, v);
}

void rms_norm_forward_cuda(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd, int v) {
  CudaCall call("rms_norm", {&x, &w, &y, &rstd});
  if (x.numel() == 0) return;
  NormArgs a = args(x, v, true);
  a.eps = eps;
  a.weight = ptr(w);
  a.y = y.raw_data();
  a.rstd = rstd.raw_data();
  launch_norm_forward(x.dtype(), a, call.stream());
}

void rms_norm_backward_cuda(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                            const Tensor& dw, int v) {
  norm_backward("rms_norm_backward", true, g, x, w, Tensor(), rstd, dx, dw, Tensor(), v);
}

}  // namespace

TESSEL_REGISTER_KERNEL(layer_norm_forward, DeviceType::CUDA, layer_norm_forward_cuda);
TESSEL_REGISTER_KERNEL(layer_norm_backward, DeviceType::CUDA, layer_norm_backward_cuda);
TESSEL_REGISTER_KERNEL(rms_norm_forward, DeviceType::CUDA, rms_norm_forward_cuda);
TESSEL_REGISTER_KERNEL(rms_norm_backward, DeviceType::CUDA, rms_norm_backward_cuda);

}  // namespace tessel::kernels::cuda
