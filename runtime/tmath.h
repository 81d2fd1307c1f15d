#pragma once
// TEMPORARY stand-in: forwards to std:: until the project's own portable
// implementations land (they must replace this file).
#include <cmath>

#include "runtime/macros.h"

namespace tessel::tmath {
#define TESSEL_TMATH_FWD(name, expr)                                   \
  TESSEL_HOST_DEVICE_INLINE float name(float x) { return expr; }       \
  TESSEL_HOST_DEVICE_INLINE double name(double x) { return std::name(x); }
TESSEL_TMATH_FWD(exp, std::exp(x))
TESSEL_TMATH_FWD(log, std::log(x))
TESSEL_TMATH_FWD(log1p, std::log1p(x))
TESSEL_TMATH_FWD(expm1, std::expm1(x))
TESSEL_TMATH_FWD(tanh, std::tanh(x))
TESSEL_TMATH_FWD(erf, std::erf(x))
TESSEL_TMATH_FWD(sin, std::sin(x))
TESSEL_TMATH_FWD(cos, std::cos(x))
#undef TESSEL_TMATH_FWD
TESSEL_HOST_DEVICE_INLINE float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
TESSEL_HOST_DEVICE_INLINE double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
TESSEL_HOST_DEVICE_INLINE float sinpi(float x) { return std::sin(float(M_PI) * x); }
TESSEL_HOST_DEVICE_INLINE float cospi(float x) { return std::cos(float(M_PI) * x); }
TESSEL_HOST_DEVICE_INLINE double sinpi(double x) { return std::sin(M_PI * x); }
TESSEL_HOST_DEVICE_INLINE double cospi(double x) { return std::cos(M_PI * x); }
TESSEL_HOST_DEVICE_INLINE float erfinv(float x) { return x; }
TESSEL_HOST_DEVICE_INLINE double erfinv(double x) { return x; }
}  // namespace tessel::tmath
