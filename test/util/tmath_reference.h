#pragma once
// Reference implementations and ulp metrics for checking runtime/tmath.h.
// Shared by test/test_tmath.cc and tools/tmath/tmath_exhaustive.cc.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "runtime/tmath.h"

namespace tessel::tmath_ref {

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Double-precision references (accurate to a few double ulps; the float
// reference value is the double result rounded to float).
inline double ref_exp(double x) { return std::exp(x); }
inline double ref_log(double x) { return std::log(x); }
inline double ref_log1p(double x) { return std::log1p(x); }
inline double ref_expm1(double x) { return std::expm1(x); }
inline double ref_tanh(double x) { return std::tanh(x); }
inline double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
inline double ref_erf(double x) { return std::erf(x); }
inline double ref_erfinv(double x) { return tmath::erfinv(x); }
inline double ref_sinpi(double x) { return tmath::sinpi(x); }
inline double ref_cospi(double x) { return tmath::cospi(x); }
inline double ref_sin(double x) { return std::sin(x); }
inline double ref_cos(double x) { return std::cos(x); }

// Distance in representable floats between a and b (0 if both NaN or equal,
// +0 and -0 are the same point). Huge if exactly one is NaN.
inline uint64_t ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return (std::isnan(a) && std::isnan(b)) ? 0 : (1ull << 40);
  auto key = [](float f) -> int64_t {
    uint32_t u = bits(f);
    int64_t m = int64_t(u & 0x7fffffffu);
    return (u >> 31) ? -m : m;
  };
  int64_t d = key(a) - key(b);
  return uint64_t(d < 0 ? -d : d);
}

// |y - ref| in ulps of the float nearest to ref (ulp of a subnormal is 2^-149;
// above FLT_MAX the ulp of FLT_MAX). For error analysis, not for the contract.
inline double frac_ulp_error(float y, double ref) {
  if (std::isnan(ref) || std::isnan(y)) return (std::isnan(ref) && std::isnan(y)) ? 0.0 : 1e30;
  if (std::isinf(y) && float(ref) == y) return 0.0;
  if (std::isinf(ref) || std::isinf(y)) return (double(y) == ref) ? 0.0 : 1e30;
  double a = std::fabs(ref);
  int e;
  std::frexp(a, &e);  // a = m * 2^e, m in [0.5, 1)
  double ulp = std::ldexp(1.0, std::max(e - 24, -149));
  if (a >= double(std::numeric_limits<float>::max())) ulp = std::ldexp(1.0, 104);
  return std::fabs(double(y) - ref) / ulp;
}

}  // namespace tessel::tmath_ref
