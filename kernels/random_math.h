#pragma once
// The value of every random element, for host and device: the one definition
// the CPU kernels (kernels/cpu/random.cc) and the CUDA kernels
// (kernels/cuda/random.cu) share, so both produce the same bits.
//
// It implements the mapping documented in runtime/philox.h:
//   element e (global row-major linear index) draws from Philox block b, word w:
//   - "narrow" layout (float32/float16/bfloat16 continuous draws, and every
//     bernoulli, randint and dropout draw whatever the output dtype):
//     b = e / 4, w = e % 4, one 32-bit word per element;
//   - "wide" layout (float64 uniform/normal/trunc-normal): b = e / 2,
//     words {2w, 2w+1} (low, high) form 64 bits, w = e % 2.
//
// Evaluation order is as written (no implicit FMA: -ffp-contract=off on the
// host, --fmad=false in nvcc) and transcendentals come from tessel::tmath.
// Header-only, no tensor or fmt dependency: nvcc compiles it.
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "runtime/dtype.h"
#include "runtime/half.h"
#include "runtime/macros.h"
#include "runtime/philox.h"
#include "runtime/tmath.h"

namespace tessel::kernels {

enum class RandomDist : uint8_t { Uniform, Normal, Bernoulli, Randint, TruncNormal };

inline const char* random_dist_name(RandomDist d) {
  switch (d) {
    case RandomDist::Uniform: return "uniform";
    case RandomDist::Normal: return "normal";
    case RandomDist::Bernoulli: return "bernoulli";
    case RandomDist::Randint: return "randint";
    case RandomDist::TruncNormal: return "trunc_normal";
  }
  return "?";
}

// What to draw. The op validates the parameters; kernels trust them.
struct RandomParams {
  RandomDist dist = RandomDist::Uniform;
  PhiloxKey key;
  // Uniform: values in [lo, hi). TruncNormal: values clamped to [lo, hi].
  double lo = 0.0, hi = 1.0;
  // Normal, TruncNormal: mean + std * z.
  double mean = 0.0, std = 1.0;
  // TruncNormal: z = sqrt(2) * erfinv(v), v uniform in (vlo, vhi) where
  // vlo = 2*Phi((lo-mean)/std) - 1, vhi = 2*Phi((hi-mean)/std) - 1.
  double vlo = -1.0, vhi = 1.0;
  // Bernoulli: 1 where (bits >> 8) < threshold, i.e. u01(bits) < p with
  // threshold = ceil(p * 2^24) (so p is resolved to multiples of 2^-24).
  uint32_t threshold = 0;
  // Randint: low + floor(bits * range / 2^32), range in [1, 2^32 - 1].
  int64_t low = 0;
  uint32_t range = 1;
};

// True when (dist, dtype) uses the wide (64-bit per element) layout.
inline bool random_wide_layout(RandomDist d, DType t) {
  return t == DType::Float64 && (d == RandomDist::Uniform || d == RandomDist::Normal || d == RandomDist::TruncNormal);
}

// Where each local element sits: after collapsing size-1 dims and merging dims
// that are contiguous both in the local tensor and in the global index, local
// element (i_0, ..., i_{n-1}) has global index base + sum i_d * gstride[d] and
// lives at out + sum i_d * ostride[d] (in + sum i_d * istride[d]).
inline constexpr int kRandomMaxDims = 8;
struct RandomGeometry {
  int ndim = 0;  // 0: a single element
  int64_t numel = 0;
  uint64_t base = 0;
  int64_t size[kRandomMaxDims] = {};
  int64_t gstride[kRandomMaxDims] = {};
  int64_t ostride[kRandomMaxDims] = {};  // elements
  int64_t istride[kRandomMaxDims] = {};  // elements (dropout input)
};

namespace rng {

// ---- uniforms from raw bits --------------------------------------------------------

// Strictly inside (0, 1), symmetric: ((x >> 9) * 2 + 1) * 2^-24, exact in float.
TESSEL_HOST_DEVICE_INLINE float u01_mid(uint32_t x) { return float(((x >> 9) << 1) | 1u) * 5.9604644775390625e-8f; }
// The same for 64 bits: ((m >> 1) * 2 + 1) * 2^-53 with m the top 53 bits.
TESSEL_HOST_DEVICE_INLINE double u01_double_mid(uint32_t lo, uint32_t hi) {
  uint64_t m = ((uint64_t(hi) << 32) | lo) >> 11;
  return double(((m >> 1) << 1) | 1u) * 1.1102230246251565e-16;
}

template <class C> struct Uniforms;
template <> struct Uniforms<float> {
  // From one word.
  static TESSEL_HOST_DEVICE_INLINE float u01(uint32_t x) { return philox::u01(x); }
  static TESSEL_HOST_DEVICE_INLINE float open0(uint32_t x) { return philox::u01_open0(x); }
  static TESSEL_HOST_DEVICE_INLINE float mid(uint32_t x) { return u01_mid(x); }
};
template <> struct Uniforms<double> {
  // From two words (low, high).
  static TESSEL_HOST_DEVICE_INLINE double u01(uint32_t lo, uint32_t hi) { return philox::u01_double(lo, hi); }
  static TESSEL_HOST_DEVICE_INLINE double open0(uint32_t lo, uint32_t hi) { return philox::u01_double_open0(lo, hi); }
  static TESSEL_HOST_DEVICE_INLINE double mid(uint32_t lo, uint32_t hi) { return u01_double_mid(lo, hi); }
};

// ---- storage conversions usable on the device -----------------------------------------
template <class T, class C>
TESSEL_HOST_DEVICE_INLINE T to_storage(C v) {
  return T(v);  // f16/bf16: round to nearest even (runtime/half.h)
}
template <class C, class T>
TESSEL_HOST_DEVICE_INLINE C from_storage(T v) {
  return static_cast<C>(v);
}

// ---- per-distribution constants in the compute type ----------------------------------

// Constants for drawing T (stored) computed in C (float for 16-bit, else T).
template <class T, class C>
struct DistConsts {
  PhiloxKey key;
  C lo, hi, span;      // uniform: lo + u * span, span = hi - lo (in C)
  C mean, std;         // normal, trunc normal
  C vlo, vspan;        // trunc normal: v = vlo + u * vspan
  T bottom, top;       // the smallest / largest T inside the range (clamps after rounding)
  uint32_t threshold;  // bernoulli, dropout
  int64_t low;         // randint
  uint32_t range;
};

// ---- the values -----------------------------------------------------------------------

// Box-Muller on one pair of uniforms: z0 (cosine branch), z1 (sine branch).
// u1 in (0, 1] so log(u1) is finite; u2 in [0, 1) and 2*pi*u2 is taken as
// sinpi/cospi(2 * u2) (exact argument).
TESSEL_HOST_DEVICE_INLINE float sqrt_ieee(float x) { return sqrtf(x); }
TESSEL_HOST_DEVICE_INLINE double sqrt_ieee(double x) { return ::sqrt(x); }

template <class C>
TESSEL_HOST_DEVICE_INLINE void box_muller(C u1, C u2, C& z0, C& z1) {
  C r = sqrt_ieee(C(-2) * tmath::log(u1));
  C t = C(2) * u2;
  z0 = r * tmath::cospi(t);
  z1 = r * tmath::sinpi(t);
}

// Clamp a rounded value into the representable range [bottom, top].
template <class T, class C>
TESSEL_HOST_DEVICE_INLINE T clamp_stored(const DistConsts<T, C>& k, C v, bool upper_open) {
  T r = to_storage<T, C>(v);
  C rc = from_storage<C, T>(r);
  if (upper_open ? !(rc < k.hi) : rc > k.hi) return k.top;
  if (rc < k.lo) return k.bottom;
  return r;
}

// Uniform [lo, hi) from a uniform u in [0, 1).
template <class T, class C>
TESSEL_HOST_DEVICE_INLINE T uniform_value(const DistConsts<T, C>& k, C u) {
  return clamp_stored<T, C>(k, k.lo + u * k.span, true);
}

// Normal from a standard normal z.
template <class T, class C>
TESSEL_HOST_DEVICE_INLINE T normal_value(const DistConsts<T, C>& k, C z) {
  return to_storage<T, C>(k.mean + k.std * z);
}

// Truncated normal (inverse CDF) from a uniform u in (0, 1):
// v = vlo + u * (vhi - vlo) in (2*Phi(alpha) - 1, 2*Phi(beta) - 1),
// value = mean + std * sqrt(2) * erfinv(v), clamped to [lo, hi].
template <class T, class C>
TESSEL_HOST_DEVICE_INLINE T trunc_normal_value(const DistConsts<T, C>& k, C u) {
  C v = k.vlo + u * k.vspan;
  C z = C(1.4142135623730951) * tmath::erfinv(v);
  C x = k.mean + k.std * z;
  x = x < k.lo ? k.lo : x;
  x = x > k.hi ? k.hi : x;
  return clamp_stored<T, C>(k, x, false);
}

template <class T>
TESSEL_HOST_DEVICE_INLINE T bernoulli_value(uint32_t threshold, uint32_t x) {
  bool one = (x >> 8) < threshold;
  if constexpr (std::is_same_v<T, bool>) return one;
  else return to_storage<T>(one ? 1.0f : 0.0f);
}

template <class T, class C>
TESSEL_HOST_DEVICE_INLINE T randint_value(const DistConsts<T, C>& k, uint32_t x) {
  int64_t v = k.low + int64_t(philox::bounded(x, k.range));
  if constexpr (std::is_integral_v<T>) return T(v);
  else return to_storage<T, C>(C(v));
}

// Narrow layout: the value of word w (0..3) of block r.
template <RandomDist D, class T, class C>
TESSEL_HOST_DEVICE_INLINE T narrow_value(const DistConsts<T, C>& k, const Philox4& r, int w) {
  if constexpr (D == RandomDist::Uniform) {
    return uniform_value<T, C>(k, C(Uniforms<float>::u01(r.v[w])));
  } else if constexpr (D == RandomDist::Normal) {
    int p = w & 2;
    C z0, z1;
    box_muller<C>(C(Uniforms<float>::open0(r.v[p])), C(Uniforms<float>::u01(r.v[p + 1])), z0, z1);
    return normal_value<T, C>(k, (w & 1) ? z1 : z0);
  } else if constexpr (D == RandomDist::TruncNormal) {
    return trunc_normal_value<T, C>(k, C(Uniforms<float>::mid(r.v[w])));
  } else if constexpr (D == RandomDist::Bernoulli) {
    return bernoulli_value<T>(k.threshold, r.v[w]);
  } else {
    return randint_value<T, C>(k, r.v[w]);
  }
}

// Narrow layout: all four values of block r (the same bits as narrow_value;
// Box-Muller computed once per pair).
template <RandomDist D, class T, class C>
TESSEL_HOST_DEVICE_INLINE void narrow_block(const DistConsts<T, C>& k, const Philox4& r, T out[4]) {
  if constexpr (D == RandomDist::Normal) {
    for (int p = 0; p < 4; p += 2) {
      C z0, z1;
      box_muller<C>(C(Uniforms<float>::open0(r.v[p])), C(Uniforms<float>::u01(r.v[p + 1])), z0, z1);
      out[p] = normal_value<T, C>(k, z0);
      out[p + 1] = normal_value<T, C>(k, z1);
    }
  } else {
    for (int w = 0; w < 4; ++w) out[w] = narrow_value<D, T, C>(k, r, w);
  }
}

// Wide layout (double): the value of element w (0..1) of block r.
template <RandomDist D>
TESSEL_HOST_DEVICE_INLINE double wide_value(const DistConsts<double, double>& k, const Philox4& r, int w) {
  using U = Uniforms<double>;
  if constexpr (D == RandomDist::Uniform) {
    return uniform_value<double, double>(k, U::u01(r.v[2 * w], r.v[2 * w + 1]));
  } else if constexpr (D == RandomDist::Normal) {
    double z0, z1;
    box_muller<double>(U::open0(r.v[0], r.v[1]), U::u01(r.v[2], r.v[3]), z0, z1);
    return normal_value<double, double>(k, w ? z1 : z0);
  } else {
    static_assert(D == RandomDist::TruncNormal, "wide layout is for continuous distributions");
    return trunc_normal_value<double, double>(k, U::mid(r.v[2 * w], r.v[2 * w + 1]));
  }
}

template <RandomDist D>
TESSEL_HOST_DEVICE_INLINE void wide_block(const DistConsts<double, double>& k, const Philox4& r, double out[2]) {
  if constexpr (D == RandomDist::Normal) {
    double z0, z1;
    box_muller<double>(Uniforms<double>::open0(r.v[0], r.v[1]), Uniforms<double>::u01(r.v[2], r.v[3]), z0, z1);
    out[0] = normal_value<double, double>(k, z0);
    out[1] = normal_value<double, double>(k, z1);
  } else {
    out[0] = wide_value<D>(k, r, 0);
    out[1] = wide_value<D>(k, r, 1);
  }
}

// Dropout: out = keep ? x * scale : 0, keep = bernoulli(1 - p) in the narrow layout.
template <class T, class C>
TESSEL_HOST_DEVICE_INLINE T dropout_value(uint32_t keep_threshold, C scale, uint32_t bits, T x) {
  return (bits >> 8) < keep_threshold ? to_storage<T, C>(from_storage<C, T>(x) * scale) : to_storage<T, C>(C(0));
}

// ---- host-side construction of the constants ----------------------------------------

// Neighbouring representable values of T (T floating).
template <class T>
inline T next_toward(T v, bool up) {
  if constexpr (std::is_same_v<T, float>) return std::nextafter(v, up ? INFINITY : -INFINITY);
  else if constexpr (std::is_same_v<T, double>) return std::nextafter(v, up ? double(INFINITY) : -double(INFINITY));
  else {
    // Sign-magnitude 16-bit formats: step the bits.
    uint16_t b = v.bits;
    bool neg = (b & 0x8000u) != 0;
    uint16_t mag = b & 0x7fffu;
    if (mag == 0) return T::from_bits(up ? 0x0001u : 0x8001u);
    if (neg == up) return T::from_bits(uint16_t(b - 1u));  // towards zero
    return T::from_bits(uint16_t(b + 1u));
  }
}

template <class T, class C>
DistConsts<T, C> make_consts(const RandomParams& p) {
  DistConsts<T, C> k{};
  k.key = p.key;
  k.threshold = p.threshold;
  k.low = p.low;
  k.range = p.range;
  if constexpr (std::is_floating_point_v<C> && !std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    k.lo = C(p.lo);
    k.hi = C(p.hi);
    k.span = k.hi - k.lo;
    k.mean = C(p.mean);
    k.std = C(p.std);
    k.vlo = C(p.vlo);
    k.vspan = C(p.vhi) - k.vlo;
    if (p.dist == RandomDist::Uniform || p.dist == RandomDist::TruncNormal) {
      bool open = p.dist == RandomDist::Uniform;
      // top: the largest T below hi (uniform) or not above hi (trunc normal).
      T t = to_storage<T, C>(k.hi);
      while (open ? !(from_storage<C, T>(t) < k.hi) : from_storage<C, T>(t) > k.hi) t = next_toward(t, false);
      k.top = t;
      T b = to_storage<T, C>(k.lo);
      while (from_storage<C, T>(b) < k.lo) b = next_toward(b, true);
      k.bottom = b;
    }
  }
  return k;
}

}  // namespace rng
}  // namespace tessel::kernels
