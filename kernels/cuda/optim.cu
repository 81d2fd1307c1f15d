// CUDA optimizer kernels: the per-element updates of kernels/optim_math.h
// (V = float, the same expressions as the CPU's scalar and AVX2 paths, every
// operation an IEEE float32 op with --fmad=false: bitwise equal to the CPU),
// the canonical sum of squares for the gradient norm, and the scale / unscale
// passes.
#include <cmath>

#include "kernels/cuda/canonical.cuh"
#include "kernels/cuda/check.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/cuda/optim_launch.h"
#include "kernels/optim_math.h"

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

template <class T>
__global__ void sum_squares_kernel(const T* x, int64_t n, int V, float* out) {
  float* smem = shared_array<float>();
  const float r = block_canonical_reduce<float>(
      n, V, 0.0f, [&](int64_t t) { return square_term(float(widen(x[t]))); }, SumCombine<float>(), smem);
  if (threadIdx.x == 0) *out = r;
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

void launch_sum_squares(DType dtype, const void* x, int64_t n, int V, float* out, cudaStream_t stream) {
  with_grad_type(dtype, "sum_squares", [&](auto tag) {
    using T = typename decltype(tag)::type;
    sum_squares_kernel<T><<<1, row_block_threads(V), size_t(V) * sizeof(float), stream>>>(static_cast<const T*>(x),
                                                                                         n, V, out);
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
