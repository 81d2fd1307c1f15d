// CUDA softmax / log-softmax, forward and backward: one block per row, the
// order of operations of kernels/softmax.h (the same bits as the CPU for
// float32): the row max as a value, e_i = tmath::exp(x_i - m), the canonical
// sum of the e_i (canonical.cuh), then y_i = e_i * (1 / s) or
// (x_i - m) - log(s). e_i is recomputed in the output pass (the same function
// of the same input, so the same bits) instead of being stored.
#include <cuda_runtime.h>

#include "kernels/cuda/call.h"
#include "kernels/cuda/canonical.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/geometry.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/launch.h"
#include "kernels/softmax.h"
#include "runtime/dtype.h"
#include "runtime/tmath.h"

// ---- launch interface: what the adapters at the end call ----
namespace tessel::kernels::cuda {

// Operands: x, out.
void launch_softmax_forward(DType dtype, const RowGeometry<2>& g, const void* x, void* out, bool log, int chunks,
                            cudaStream_t stream);
// Operands: g, y, dx.
void launch_softmax_backward(DType dtype, const RowGeometry<3>& geo, const void* g, const void* y, void* dx, bool log,
                             int chunks, cudaStream_t stream);

}  // namespace tessel::kernels::cuda

namespace tessel::kernels::cuda {
namespace {

template <class T>
__global__ void softmax_forward_kernel(RowGeometry<2> g, const T* x, T* out, bool log, int V) {
  using C = acc_t<T>;
  C* smem = shared_array<C>();
  const int64_t n = g.n, xs = g.inner_stride[0], os = g.inner_stride[1];
  for (int64_t r = blockIdx.x; r < g.rows; r += gridDim.x) {
    const T* xr = x + row_offset(g, r, 0);
    T* orow = out + row_offset(g, r, 1);
    auto ld = [&](int64_t t) { return C(widen(xr[t * xs])); };
    const C m = block_row_max<C>(n, V, ld, smem);
    const C s = block_canonical_reduce<C>(
        n, V, C(0), [&](int64_t t) { return tmath::exp(ld(t) - m); }, SumCombine<C>(), smem);
    if (!log) {
      const C rcp = C(1) / s;
      for (int64_t t = threadIdx.x; t < n; t += blockDim.x) orow[t * os] = narrow<T>(tmath::exp(ld(t) - m) * rcp);
    } else {
      const C lse = tmath::log(s);
      for (int64_t t = threadIdx.x; t < n; t += blockDim.x) orow[t * os] = narrow<T>((ld(t) - m) - lse);
    }
  }
}

template <class T>
__global__ void softmax_backward_kernel(RowGeometry<3> geo, const T* g, const T* y, T* dx, bool log, int V) {
  using C = acc_t<T>;
  C* smem = shared_array<C>();
  const int64_t n = geo.n, gs = geo.inner_stride[0], ys = geo.inner_stride[1], ds = geo.inner_stride[2];
  for (int64_t r = blockIdx.x; r < geo.rows; r += gridDim.x) {
    const T* gr = g + row_offset(geo, r, 0);
    const T* yr = y + row_offset(geo, r, 1);
    T* dr = dx + row_offset(geo, r, 2);
    auto gl = [&](int64_t t) { return C(widen(gr[t * gs])); };
    auto yl = [&](int64_t t) { return C(widen(yr[t * ys])); };
    if (!log) {
      const C d = block_canonical_reduce<C>(
          n, V, C(0), [&](int64_t t) { return gl(t) * yl(t); }, SumCombine<C>(), smem);
      for (int64_t t = threadIdx.x; t < n; t += blockDim.x) dr[t * ds] = narrow<T>(yl(t) * (gl(t) - d));
    } else {
      const C s = block_canonical_reduce<C>(n, V, C(0), gl, SumCombine<C>(), smem);
      for (int64_t t = threadIdx.x; t < n; t += blockDim.x) dr[t * ds] = narrow<T>(gl(t) - tmath::exp(yl(t)) * s);
    }
  }
}

unsigned row_blocks(int64_t rows) { return unsigned(rows < kMaxBlocks ? rows : kMaxBlocks); }

}  // namespace

void launch_softmax_forward(DType dtype, const RowGeometry<2>& g, const void* x, void* out, bool log, int V,
                            cudaStream_t s) {
  if (g.rows == 0 || g.n == 0) return;
  const char* op = log ? "log_softmax" : "softmax";
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_forward_kernel<T><<<row_blocks(g.rows), row_block_threads(V), size_t(V) * sizeof(acc_t<T>), s>>>(
        g, static_cast<const T*>(x), static_cast<T*>(out), log, V);
    TESSEL_CUDA_CHECK_LAUNCH(op);
  });
}

void launch_softmax_backward(DType dtype, const RowGeometry<3>& geo, const void* g, const void* y, void* dx, bool log,
                             int V, cudaStream_t s) {
  if (geo.rows == 0 || geo.n == 0) return;
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  dispatch_floating(dtype, op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    softmax_backward_kernel<T><<<row_blocks(geo.rows), row_block_threads(V), size_t(V) * sizeof(acc_t<T>), s>>>(
        geo, static_cast<const T*>(g), static_cast<const T*>(y), static_cast<T*>(dx), log, V);
    TESSEL_CUDA_CHECK_LAUNCH(op);
  });
}

}  // namespace tessel::kernels::cuda

// ---- KernelTable adapters: register the CUDA softmax kernels.
namespace tessel::kernels::cuda {
namespace {

void softmax_forward_cuda(const Tensor& x, int64_t dim, bool log, const Tensor& out, int v) {
  const char* op = log ? "log_softmax" : "softmax";
  CudaCall call(op, {&x, &out});
  const int d = wrap_dim(dim, x.dim(), op);
  if (x.numel() == 0) return;
  launch_softmax_forward(x.dtype(), make_row_geometry<2>({&x, &out}, d), x.raw_data(), out.raw_data(), log, v,
                         call.stream());
}

void softmax_backward_cuda(const Tensor& g, const Tensor& y, int64_t dim, bool log, const Tensor& dx, int v) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  CudaCall call(op, {&g, &y, &dx});
  const int d = wrap_dim(dim, y.dim(), op);
  if (y.numel() == 0) return;
  launch_softmax_backward(y.dtype(), make_row_geometry<3>({&g, &y, &dx}, d), g.raw_data(), y.raw_data(),
                          dx.raw_data(), log, v, call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(softmax_forward, DeviceType::CUDA, softmax_forward_cuda);
TESSEL_REGISTER_KERNEL(softmax_backward, DeviceType::CUDA, softmax_backward_cuda);

}  // namespace tessel::kernels::cuda
