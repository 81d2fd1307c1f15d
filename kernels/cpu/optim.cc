// CPU optimizer kernels: AVX2, 8 elements at a time, the formulas of
// kernels/optim_math.h with V = __m256 (GCC vector operators act per lane, so
// each lane runs exactly the scalar expression) and V = float for the rest.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>

#include "kernels/canonical.h"
#include "kernels/cpu/canonical_simd.h"
#include "kernels/cpu/loops.h"
#include "kernels/optim.h"
#include "kernels/optim_math.h"

namespace tessel::kernels::cpu {
namespace {

struct Avx2Sqrt {
  __m256 operator()(__m256 x) const { return _mm256_sqrt_ps(x); }
};
inline __m256 bcast8(float x) { return _mm256_set1_ps(x); }
inline float bcast1(float x) { return x; }

// Eight gradient values widened to float (exact for every dtype).
template <class G>
inline __m256 load8(const G* g) {
  if constexpr (std::is_same_v<G, float>) {
    return _mm256_loadu_ps(g);
  } else if constexpr (std::is_same_v<G, bf16>) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(g));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    alignas(32) float w[8];
    for (int l = 0; l < 8; ++l) w[l] = float(g[l]);
    return _mm256_load_ps(w);
  }
}

// The first k (< 8) values widened, the rest +0.
template <class G>
inline __m256 load_partial8(const G* g, int64_t k) {
  if constexpr (std::is_same_v<G, float>) {
    return _mm256_maskload_ps(g, first_lanes_mask(k));
  } else {
    alignas(32) float w[8] = {};
    for (int64_t l = 0; l < k; ++l) w[l] = float(g[l]);
    return _mm256_load_ps(w);
  }
}

template <class F>
void with_grad_type(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float32: return f(TypeTag<float>{});
    case DType::BFloat16: return f(TypeTag<bf16>{});
    case DType::Float16: return f(TypeTag<f16>{});
    default: throw_unsupported_dtype(op, t, "float32, bfloat16 or float16 gradients");
  }
}

// The optimizer (nn/optim.cc) checks what a user hands it -- parameters
// float32, gradients' dtype, device and shape -- so the kernels check only the
// state it keeps (exp_avg, exp_avg_sq, momentum_buffer), which no op checks:
// they are called from the optimizer, not through call().
void check_f32(const char* op, const char* what, const Tensor& t) {
  TESSEL_CHECK(t.dtype() == DType::Float32, op, "{} must be float32, got {}", what, t.desc());
}

// ---- AdamW ------------------------------------------------------------------------
template <class G>
void adamw_typed(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const AdamWScalars& s) {
  const AdamWCoef<__m256> c8 = broadcast_coef<__m256>(s, bcast8);
  const AdamWCoef<float> c1 = broadcast_coef<float>(s, bcast1);
  strided_loop<4>({&param, &grad, &m, &v}, kElementwiseGrain, [&](int64_t n, char* const* ptr, const int64_t* st) {
    float* p = reinterpret_cast<float*>(ptr[0]);
    const G* g = reinterpret_cast<const G*>(ptr[1]);
    float* ma = reinterpret_cast<float*>(ptr[2]);
    float* va = reinterpret_cast<float*>(ptr[3]);
    if (st[0] == 4 && st[1] == int64_t(sizeof(G)) && st[2] == 4 && st[3] == 4) {
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        __m256 pp = _mm256_loadu_ps(p + i), mm = _mm256_loadu_ps(ma + i), vv = _mm256_loadu_ps(va + i);
        adamw_update<__m256>(pp, mm, vv, load8(g + i), c8, Avx2Sqrt());
        _mm256_storeu_ps(p + i, pp);
        _mm256_storeu_ps(ma + i, mm);
        _mm256_storeu_ps(va + i, vv);
      }
      for (; i < n; ++i) adamw_update<float>(p[i], ma[i], va[i], float(g[i]), c1, ScalarSqrt());
    } else {
      const int64_t s0 = st[0] / 4, s1 = st[1] / int64_t(sizeof(G)), s2 = st[2] / 4, s3 = st[3] / 4;
      for (int64_t i = 0; i < n; ++i)
        adamw_update<float>(p[i * s0], ma[i * s2], va[i * s3], float(g[i * s1]), c1, ScalarSqrt());
    }
  });
}

void adamw_step_cpu(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                    const AdamWScalars& s) {
  check_f32("adamw_step", "exp_avg", m);
  check_f32("adamw_step", "exp_avg_sq", v);
  TESSEL_CHECK(m.shape() == param.shape() && v.shape() == param.shape(), "adamw_step",
               "shapes differ: param {}, exp_avg {}, exp_avg_sq {}", param.desc(), m.desc(), v.desc());
  with_grad_type(grad.dtype(), "adamw_step",
                 [&](auto tag) { adamw_typed<typename decltype(tag)::type>(param, grad, m, v, s); });
}

// ---- SGD --------------------------------------------------------------------------
template <class G>
void sgd_typed(const Tensor& param, const Tensor& grad, const Tensor& buf, const SGDScalars& s) {
  const SGDCoef<__m256> c8 = broadcast_coef<__m256>(s, bcast8);
  const SGDCoef<float> c1 = broadcast_coef<float>(s, bcast1);
  if (s.use_momentum) {
    strided_loop<3>({&param, &grad, &buf}, kElementwiseGrain, [&](int64_t n, char* const* ptr, const int64_t* st) {
      float* p = reinterpret_cast<float*>(ptr[0]);
      const G* g = reinterpret_cast<const G*>(ptr[1]);
      float* b = reinterpret_cast<float*>(ptr[2]);
      if (st[0] == 4 && st[1] == int64_t(sizeof(G)) && st[2] == 4) {
        int64_t i = 0;
        for (; i + 8 <= n; i += 8) {
          __m256 pp = _mm256_loadu_ps(p + i), bb = _mm256_loadu_ps(b + i);
          sgd_update<__m256>(pp, &bb, load8(g + i), c8, s);
          _mm256_storeu_ps(p + i, pp);
          _mm256_storeu_ps(b + i, bb);
        }
        for (; i < n; ++i) sgd_update<float>(p[i], b + i, float(g[i]), c1, s);
      } else {
        const int64_t s0 = st[0] / 4, s1 = st[1] / int64_t(sizeof(G)), s2 = st[2] / 4;
        for (int64_t i = 0; i < n; ++i) sgd_update<float>(p[i * s0], b + i * s2, float(g[i * s1]), c1, s);
      }
    });
    return;
  }
  strided_loop<2>({&param, &grad}, kElementwiseGrain, [&](int64_t n, char* const* ptr, const int64_t* st) {
    float* p = reinterpret_cast<float*>(ptr[0]);
    const G* g = reinterpret_cast<const G*>(ptr[1]);
    if (st[0] == 4 && st[1] == int64_t(sizeof(G))) {
      int64_t i = 0;
      for (; i + 8 <= n; i += 8) {
        __m256 pp = _mm256_loadu_ps(p + i);
        sgd_update<__m256>(pp, nullptr, load8(g + i), c8, s);
        _mm256_storeu_ps(p + i, pp);
      }
      for (; i < n; ++i) sgd_update<float>(p[i], nullptr, float(g[i]), c1, s);
    } else {
      const int64_t s0 = st[0] / 4, s1 = st[1] / int64_t(sizeof(G));
      for (int64_t i = 0; i < n; ++i) sgd_update<float>(p[i * s0], nullptr, float(g[i * s1]), c1, s);
    }
  });
}

void sgd_step_cpu(const Tensor& param, const Tensor& grad, const Tensor& buf, const SGDScalars& s) {
  if (s.use_momentum) {
    TESSEL_CHECK(buf.defined(), "sgd_step", "momentum {} needs a momentum buffer", s.momentum);
    check_f32("sgd_step", "momentum_buffer", buf);
    TESSEL_CHECK(buf.shape() == param.shape(), "sgd_step", "shapes differ: param {}, momentum_buffer {}",
                 param.desc(), buf.desc());
  }
  with_grad_type(grad.dtype(), "sgd_step",
                 [&](auto tag) { sgd_typed<typename decltype(tag)::type>(param, grad, buf, s); });
}

// ---- sum of squares ------------------------------------------------------------------
// Chunk [0, len) of x: lane l accumulates elements l, l + 8, ... in ascending
// order, acc = acc + x*x (no FMA), then the lane tree.
template <class G>
inline float chunk_sumsq(const G* x, int64_t len) {
  __m256 acc = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    __m256 a = load8(x + j);
    acc = acc + a * a;
  }
  if (j < len) {
    __m256 a = load_partial8(x + j, len - j);  // missing lanes add +0 * +0 = +0: no change
    acc = acc + a * a;
  }
  return lane_tree8(acc);
}

// Four equal-length chunks at once (independent dependency chains).
template <class G>
inline void chunk_sumsq4(const G* x0, const G* x1, const G* x2, const G* x3, int64_t len, float* out) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    __m256 b0 = load8(x0 + j), b1 = load8(x1 + j), b2 = load8(x2 + j), b3 = load8(x3 + j);
    a0 = a0 + b0 * b0;
    a1 = a1 + b1 * b1;
    a2 = a2 + b2 * b2;
    a3 = a3 + b3 * b3;
  }
  if (j < len) {
    __m256 b0 = load_partial8(x0 + j, len - j), b1 = load_partial8(x1 + j, len - j);
    __m256 b2 = load_partial8(x2 + j, len - j), b3 = load_partial8(x3 + j, len - j);
    a0 = a0 + b0 * b0;
    a1 = a1 + b1 * b1;
    a2 = a2 + b2 * b2;
    a3 = a3 + b3 * b3;
  }
  out[0] = lane_tree8(a0);
  out[1] = lane_tree8(a1);
  out[2] = lane_tree8(a2);
  out[3] = lane_tree8(a3);
}

template <class G>
float sum_squares_typed(const G* x, int64_t n, int v) {
  float vals[kMaxChunks];
  const int64_t cs = numerics::chunk_size(n, v);
  const int groups = (v + 3) / 4;
  auto run = [&](int64_t gb, int64_t ge) {
    for (int64_t grp = gb; grp < ge; ++grp) {
      const int c0 = int(grp) * 4;
      if (c0 + 4 <= v && (c0 + 4) * cs <= n) {
        chunk_sumsq4(x + c0 * cs, x + (c0 + 1) * cs, x + (c0 + 2) * cs, x + (c0 + 3) * cs, cs, vals + c0);
        continue;
      }
      for (int c = c0; c < std::min(c0 + 4, v); ++c) {
        const int64_t b = numerics::chunk_begin(n, v, c), e = numerics::chunk_end(n, v, c);
        vals[c] = chunk_sumsq(x + b, e - b);
      }
    }
  };
  if (n >= 2 * kElementwiseGrain) {
    parallel_for(groups, 1, run);
  } else {
    run(0, groups);
  }
  return tree_combine(vals, v, SumCombine<float>());
}

void sum_squares_cpu(const Tensor& x, int chunks, const Tensor& out) {
  TESSEL_CHECK(x.is_contiguous(), "sum_squares", "needs a contiguous input, got {}", x.desc());
  TESSEL_CHECK(out.numel() == 1 && out.dtype() == DType::Float32, "sum_squares",
               "output must be one float32 element, got {}", out.desc());
  TESSEL_CHECK(chunks >= 1 && chunks <= kMaxChunks && (chunks & (chunks - 1)) == 0, "sum_squares",
               "chunks must be a power of two in [1, {}], got {}", kMaxChunks, chunks);
  float* o = static_cast<float*>(out.raw_data());
  with_grad_type(x.dtype(), "sum_squares", [&](auto tag) {
    using G = typename decltype(tag)::type;
    *o = x.numel() == 0 ? 0.0f : sum_squares_typed(static_cast<const G*>(x.raw_data()), x.numel(), chunks);
  });
}

// ---- scale ----------------------------------------------------------------------------
void scale_inplace_cpu(const Tensor& x, float s) {
  with_grad_type(x.dtype(), "scale_inplace", [&](auto tag) {
    using T = typename decltype(tag)::type;
    strided_loop<1>({&x}, kElementwiseGrain, [&](int64_t n, char* const* ptr, const int64_t* st) {
      T* a = reinterpret_cast<T*>(ptr[0]);
      const int64_t s0 = st[0] / int64_t(sizeof(T));
      for (int64_t i = 0; i < n; ++i) a[i * s0] = store<T>(float(a[i * s0]) * s);
    });
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(adamw_step, DeviceType::CPU, adamw_step_cpu);
TESSEL_REGISTER_KERNEL(sgd_step, DeviceType::CPU, sgd_step_cpu);
TESSEL_REGISTER_KERNEL(sum_squares, DeviceType::CPU, sum_squares_cpu);
TESSEL_REGISTER_KERNEL(scale_inplace, DeviceType::CPU, scale_inplace_cpu);

}  // namespace tessel::kernels::cpu
