// CUDA optimizer kernels: the per-element updates of kernels/optim_math.h
// (V = float, the same expressions as the CPU's scalar and AVX2 paths, every
// operation an IEEE float32 op with --fmad=false: bitwise equal to the CPU),
// the canonical sum of squares for the gradient norm, and the scale / unscale
// passes.
#include <cmath>
#include <cuda_runtime.h>

#include "kernels/amp.h"
#include "kernels/cuda/call.h"
#include "kernels/cuda/canonical.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/geometry.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/optim.h"
#include "kernels/optim_math.h"

// ---- launch interface: what the adapters at the end call ----
namespace tessel::kernels::cuda {

// Operands: param, grad, exp_avg, exp_avg_sq (grad: float32/bfloat16/float16).
void launch_adamw(DType grad_dtype, const ElemGeometry<4>& g, float* p, const void* grad, float* m, float* v,
                  const AdamWScalars& s, cudaStream_t stream);
// Operands: param, grad[, momentum_buf] (buf null when !s.use_momentum; then g has 2 operands used).
void launch_sgd(DType grad_dtype, const ElemGeometry<3>& g, float* p, const void* grad, float* buf,
                const SGDScalars& s, cudaStream_t stream);
// out (one float) = canonical sum of square_term(x[t]) over contiguous x[0..n);
// partial: device scratch of `chunks` floats (the chunk values).
void launch_sum_squares(DType dtype, const void* x, int64_t n, int chunks, float* partial, float* out,
                        cudaStream_t stream);
// x = x * s (in float, rounded once).
void launch_scale(DType dtype, const ElemGeometry<1>& g, void* x, float s, cudaStream_t stream);
// x = x * inv_scale, *found_inf = 1 if any element was inf/NaN.
void launch_amp_unscale(DType dtype, const ElemGeometry<1>& g, void* x, float inv_scale, float* found_inf,
                        cudaStream_t stream);

}  // namespace tessel::kernels::cuda

namespace tessel::kernels::cuda {
namespace {

template <class F>
void with_grad_type(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::BFloat16: return f(TypeTag<bf16>{});
    case DType::Float16: return f(TypeTag<f16>{});
    default: throw_unsupported_dtype(op, t, "float32, bfloat16 or float16 gradients");
  }
}

struct Ident {
  __host__ __device__ float operator()(float x) const { return x; }
};

template <class G>
struct AdamWFn {
  float* p;
  const G* g;
  float* m;
  float* v;
  AdamWCoef<float> c;
  __device__ void operator()(const int64_t* off) const {
    float pp = p[off[0]], mm = m[off[2]], vv = v[off[3]];
    adamw_update<float>(pp, mm, vv, float(widen(g[off[1]])), c, ScalarSqrt());
    p[off[0]] = pp;
    m[off[2]] = mm;
    v[off[3]] = vv;
  }
};

template <class G>
struct SGDFn {
  float* p;
  const G* g;
  float* buf;
  SGDCoef<float> c;
  SGDScalars s;
  __device__ void operator()(const int64_t* off) const {
    float pp = p[off[0]];
    if (s.use_momentum) {
      float bb = buf[off[2]];
      sgd_update<float>(pp, &bb, float(widen(g[off[1]])), c, s);
      buf[off[2]] = bb;
    } else {
      sgd_update<float>(pp, nullptr, float(widen(g[off[1]])), c, s);
    }
    p[off[0]] = pp;
  }
};

// The canonical sum of squares (kernels/canonical.h) over the whole GPU:
// one block per chunk. A chunk is 8 sequential lanes, so only 8 threads can
// add; the block's other warps stream the chunk through shared memory in
// tiles (coalesced, 16 loads in flight per thread, double-buffered) while
// threads 0-7 of the first warp -- the chunk's lanes -- fold the previous
// tile in the reference's order. (One block doing every chunk, as
// block_canonical_reduce does, read GPT-2's 124M gradients at ~8 GB/s:
// 60 ms of a 117 ms step on an H200.) The chunk values go to `partial`;
// sum_squares_tree_kernel combines them.
constexpr int kSquaresThreads = 256;
constexpr int kSquaresLoaders = kSquaresThreads - 32;  // warps 1.. load
constexpr int kSquaresTile = 4096;                     // a multiple of 8: tile element i is lane i % 8
constexpr int kSquaresUnroll = 16;

template <class T>
__global__ void __launch_bounds__(kSquaresThreads)
    sum_squares_chunk_kernel(const T* __restrict__ x, int64_t n, int V, float* __restrict__ partial) {
  __shared__ float tile[2][kSquaresTile];
  const int c = blockIdx.x;
  const int64_t b = numerics::chunk_begin(n, V, c), e = numerics::chunk_end(n, V, c);
  const int64_t tiles = e > b ? (e - b + kSquaresTile - 1) / kSquaresTile : 0;
  const bool loader = threadIdx.x >= 32;
  auto stage = [&](int64_t k) {
    float* buf = tile[k & 1];
    const int64_t base = b + k * kSquaresTile;
    const int m = int(e - base < kSquaresTile ? e - base : kSquaresTile);
    for (int i0 = int(threadIdx.x) - 32; i0 < m; i0 += kSquaresUnroll * kSquaresLoaders) {
      float v[kSquaresUnroll];
#pragma unroll
      for (int u = 0; u < kSquaresUnroll; ++u) {
        const int i = i0 + u * kSquaresLoaders;
        v[u] = i < m ? square_term(float(widen(x[base + i]))) : 0.0f;
      }
#pragma unroll
      for (int u = 0; u < kSquaresUnroll; ++u) {
        const int i = i0 + u * kSquaresLoaders;
        if (i < m) buf[i] = v[u];
      }
    }
  };
  float acc = 0.0f;  // threads 0-7: lane threadIdx.x of the chunk
  if (loader && tiles > 0) stage(0);
  __syncthreads();
  for (int64_t k = 0; k < tiles; ++k) {
    if (loader) {
      if (k + 1 < tiles) stage(k + 1);
    } else if (threadIdx.x < 8) {
      const float* buf = tile[k & 1];
      const int64_t base = b + k * kSquaresTile;
      const int m = int(e - base < kSquaresTile ? e - base : kSquaresTile);
      for (int i = int(threadIdx.x); i < m; i += 8) acc = acc + buf[i];
    }
    __syncthreads();
  }
  if (!loader) {  // the whole first warp (the shuffles need it); threads 8-31 hold +0
    acc = lane_tree_shfl(acc, SumCombine<float>());
    if (threadIdx.x == 0) partial[c] = acc;
  }
}

// The balanced tree over the V chunk values (V <= 1024: one thread).
__global__ void sum_squares_tree_kernel(float* partial, int V, float* out) {
  *out = tree_combine(partial, V, SumCombine<float>());
}

template <class T>
struct ScaleFn {
  T* x;
  float s;
  __device__ void operator()(const int64_t* off) const { x[off[0]] = narrow<T>(float(widen(x[off[0]])) * s); }
};

template <class T>
struct UnscaleFn {
  T* x;
  float inv;
  float* found;
  __device__ void operator()(const int64_t* off) const {
    const float v = float(widen(x[off[0]]));
    if (!isfinite(v)) *found = 1.0f;  // every writer stores the same value
    x[off[0]] = narrow<T>(v * inv);
  }
};

}  // namespace

void launch_adamw(DType grad_dtype, const ElemGeometry<4>& g, float* p, const void* grad, float* m, float* v,
                  const AdamWScalars& s, cudaStream_t stream) {
  with_grad_type(grad_dtype, "adamw_step", [&](auto tag) {
    using G = typename decltype(tag)::type;
    launch_elementwise<4>(g, AdamWFn<G>{p, static_cast<const G*>(grad), m, v, broadcast_coef<float>(s, Ident())},
                          stream, "adamw_step");
  });
}

void launch_sgd(DType grad_dtype, const ElemGeometry<3>& g, float* p, const void* grad, float* buf,
                const SGDScalars& s, cudaStream_t stream) {
  with_grad_type(grad_dtype, "sgd_step", [&](auto tag) {
    using G = typename decltype(tag)::type;
    launch_elementwise<3>(g, SGDFn<G>{p, static_cast<const G*>(grad), buf, broadcast_coef<float>(s, Ident()), s},
                          stream, "sgd_step");
  });
}

void launch_sum_squares(DType dtype, const void* x, int64_t n, int V, float* partial, float* out,
                        cudaStream_t stream) {
  with_grad_type(dtype, "sum_squares", [&](auto tag) {
    using T = typename decltype(tag)::type;
    sum_squares_chunk_kernel<T><<<unsigned(V), kSquaresThreads, 0, stream>>>(static_cast<const T*>(x), n, V, partial);
    TESSEL_CUDA_CHECK_LAUNCH("sum_squares");
    sum_squares_tree_kernel<<<1, 1, 0, stream>>>(partial, V, out);
    TESSEL_CUDA_CHECK_LAUNCH("sum_squares");
  });
}

void launch_scale(DType dtype, const ElemGeometry<1>& g, void* x, float s, cudaStream_t stream) {
  with_grad_type(dtype, "scale_inplace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise<1>(g, ScaleFn<T>{static_cast<T*>(x), s}, stream, "scale_inplace");
  });
}

void launch_amp_unscale(DType dtype, const ElemGeometry<1>& g, void* x, float inv_scale, float* found_inf,
                        cudaStream_t stream) {
  with_grad_type(dtype, "amp_unscale", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise<1>(g, UnscaleFn<T>{static_cast<T*>(x), inv_scale, found_inf}, stream, "amp_unscale");
  });
}

}  // namespace tessel::kernels::cuda

// ---- KernelTable adapters: register the CUDA optimizer kernels and the AMP unscale.
namespace tessel::kernels::cuda {
namespace {

// As on the CPU (kernels/cpu/optim.cc): the optimizer checks what a user
// hands it; the kernels check the state it keeps.
void check_f32(const char* op, const char* what, const Tensor& t) {
  TESSEL_CHECK(t.dtype() == DType::Float32, op, "{} must be float32, got {}", what, t.desc());
}

void adamw_step_cuda(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const AdamWScalars& s) {
  CudaCall call("adamw_step", {&param, &grad, &m, &v});
  check_f32("adamw_step", "exp_avg", m);
  check_f32("adamw_step", "exp_avg_sq", v);
  TESSEL_CHECK(m.shape() == param.shape() && v.shape() == param.shape(), "adamw_step",
               "shapes differ: param {}, exp_avg {}, exp_avg_sq {}", param.desc(), m.desc(), v.desc());
  launch_adamw(grad.dtype(), make_elem_geometry<4>({&param, &grad, &m, &v}), param.data<float>(), grad.raw_data(),
               m.data<float>(), v.data<float>(), s, call.stream());
}

void sgd_step_cuda(const Tensor& param, const Tensor& grad, const Tensor& buf, const SGDScalars& s) {
  CudaCall call("sgd_step", {&param, &grad, &buf});
  if (s.use_momentum) {
    TESSEL_CHECK(buf.defined(), "sgd_step", "momentum {} needs a momentum buffer", s.momentum);
    check_f32("sgd_step", "momentum_buffer", buf);
    TESSEL_CHECK(buf.shape() == param.shape(), "sgd_step", "shapes differ: param {}, momentum_buffer {}",
                 param.desc(), buf.desc());
  }
  const Tensor& third = s.use_momentum ? buf : param;  // without momentum the third operand is never read
  launch_sgd(grad.dtype(), make_elem_geometry<3>({&param, &grad, &third}), param.data<float>(), grad.raw_data(),
             s.use_momentum ? buf.data<float>() : nullptr, s, call.stream());
}

void sum_squares_cuda(const Tensor& x, int chunks, const Tensor& out) {
  CudaCall call("sum_squares", {&x, &out});
  TESSEL_CHECK(x.is_contiguous(), "sum_squares", "needs a contiguous input, got {}", x.desc());
  TESSEL_CHECK(out.numel() == 1 && out.dtype() == DType::Float32, "sum_squares",
               "output must be one float32 element, got {}", out.desc());
  TESSEL_CHECK(chunks >= 1 && chunks <= 1024 && (chunks & (chunks - 1)) == 0, "sum_squares",
               "chunks must be a power of two in [1, 1024], got {}", chunks);
  Tensor partial = scratch(call, {chunks}, DType::Float32);
  launch_sum_squares(x.dtype(), x.raw_data(), x.numel(), chunks, partial.data<float>(),
                     static_cast<float*>(out.raw_data()), call.stream());
}

void scale_inplace_cuda(const Tensor& x, float s) {
  CudaCall call("scale_inplace", {&x});
  launch_scale(x.dtype(), make_elem_geometry<1>({&x}), x.raw_data(), s, call.stream());
}

void amp_unscale_cuda(const Tensor& x, const Tensor& found_inf, float inv_scale) {
  CudaCall call("amp_unscale", {&x, &found_inf});
  TESSEL_CHECK(found_inf.numel() == 1 && found_inf.dtype() == DType::Float32, "amp_unscale",
               "found_inf must be one float32 element, got {}", found_inf.desc());
  launch_amp_unscale(x.dtype(), make_elem_geometry<1>({&x}), x.raw_data(), inv_scale,
                     static_cast<float*>(found_inf.raw_data()), call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(adamw_step, DeviceType::CUDA, adamw_step_cuda);
TESSEL_REGISTER_KERNEL(sgd_step, DeviceType::CUDA, sgd_step_cuda);
TESSEL_REGISTER_KERNEL(sum_squares, DeviceType::CUDA, sum_squares_cuda);
TESSEL_REGISTER_KERNEL(scale_inplace, DeviceType::CUDA, scale_inplace_cuda);
TESSEL_REGISTER_KERNEL(amp_unscale, DeviceType::CUDA, amp_unscale_cuda);

}  // namespace tessel::kernels::cuda
