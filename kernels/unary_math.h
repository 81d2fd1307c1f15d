#pragma once
// Scalar definitions of every unary op and its derivative, for host and
// device. Each expression is the contract: evaluation order as written, no
// implicit FMA (CPU builds use -ffp-contract=off, nvcc --fmad=false), and
// tessel::tmath instead of the platform's libm, so CPU and CUDA agree bitwise.
#include <cmath>

#include "kernels/unary.h"
#include "runtime/macros.h"
#include "runtime/tmath.h"

namespace tessel::kernels {

template <UnaryOp Op>
struct UnaryFn;

#define TESSEL_UNARY(OP, FWD, BWD)                                       \
  template <>                                                            \
  struct UnaryFn<UnaryOp::OP> {                                          \
    template <class C>                                                   \
    static TESSEL_HOST_DEVICE_INLINE C fwd(C x) {                        \
      return FWD;                                                        \
    }                                                                    \
    template <class C>                                                   \
    static TESSEL_HOST_DEVICE_INLINE C bwd(C g, C x, C y) {              \
      (void)x;                                                           \
      (void)y;                                                           \
      return BWD;                                                        \
    }                                                                    \
  };

// Constants as the nearest float/double of the exact value.
template <class C> inline constexpr C kSqrt2OverPi = C(0.7978845608028654);    // sqrt(2/pi)
template <class C> inline constexpr C kInvSqrt2 = C(0.7071067811865476);       // 1/sqrt(2)
template <class C> inline constexpr C kInvSqrt2Pi = C(0.3989422804014327);     // 1/sqrt(2 pi)
template <class C> inline constexpr C kTwoOverSqrtPi = C(1.1283791670955126);  // 2/sqrt(pi)
template <class C> inline constexpr C kGeluCoef = C(0.044715);

template <class C>
TESSEL_HOST_DEVICE_INLINE C sign_of(C x) {
  return x > C(0) ? C(1) : (x < C(0) ? C(-1) : (x == C(0) ? C(0) : x));  // NaN stays NaN
}

template <class C>
TESSEL_HOST_DEVICE_INLINE C gelu_tanh_inner(C x) {
  return kSqrt2OverPi<C> * (x + kGeluCoef<C> * x * x * x);
}

template <class C>
TESSEL_HOST_DEVICE_INLINE C gelu_tanh_bwd(C g, C x) {
  C t = tmath::tanh(gelu_tanh_inner(x));
  C dinner = kSqrt2OverPi<C> * (C(1) + C(3) * kGeluCoef<C> * x * x);
  return g * (C(0.5) * (C(1) + t) + C(0.5) * x * (C(1) - t * t) * dinner);
}

template <class C>
TESSEL_HOST_DEVICE_INLINE C round_half_even(C x) {
  // Values with |x| >= 2^23 (2^52 for double) are integers already.
  C big = sizeof(C) == 4 ? C(8388608.0) : C(4503599627370496.0);
  C a = x < C(0) ? -x : x;
  if (!(a < big)) return x;
  C r = (a + big) - big;  // round to nearest even in the current rounding mode
  return x < C(0) ? -r : r;
}

TESSEL_UNARY(Neg, -x, -g)
TESSEL_UNARY(Abs, x < C(0) ? -x : (x == C(0) ? C(0) : x), g * sign_of(x))
TESSEL_UNARY(Sign, sign_of(x), C(0))
TESSEL_UNARY(Exp, tmath::exp(x), g * y)
TESSEL_UNARY(Log, tmath::log(x), g / x)
TESSEL_UNARY(Log1p, tmath::log1p(x), g / (C(1) + x))
TESSEL_UNARY(Expm1, tmath::expm1(x), g * (y + C(1)))
TESSEL_UNARY(Sqrt, std::sqrt(x), g / (C(2) * y))
TESSEL_UNARY(Rsqrt, C(1) / std::sqrt(x), g * (C(-0.5) * y * y * y))
TESSEL_UNARY(Sin, tmath::sin(x), g * tmath::cos(x))
TESSEL_UNARY(Cos, tmath::cos(x), -(g * tmath::sin(x)))
TESSEL_UNARY(Tanh, tmath::tanh(x), g * (C(1) - y * y))
TESSEL_UNARY(Sigmoid, tmath::sigmoid(x), g * y * (C(1) - y))
TESSEL_UNARY(Relu, x > C(0) ? x : (x != x ? x : C(0)), x > C(0) ? g : C(0))
TESSEL_UNARY(Gelu, C(0.5) * x * (C(1) + tmath::tanh(gelu_tanh_inner(x))), gelu_tanh_bwd(g, x))
TESSEL_UNARY(GeluErf, C(0.5) * x * (C(1) + tmath::erf(x * kInvSqrt2<C>)),
             g * (C(0.5) * (C(1) + tmath::erf(x * kInvSqrt2<C>)) + x * kInvSqrt2Pi<C> * tmath::exp(C(-0.5) * x * x)))
TESSEL_UNARY(Silu, x * tmath::sigmoid(x),
             g * (tmath::sigmoid(x) + x * tmath::sigmoid(x) * (C(1) - tmath::sigmoid(x))))
TESSEL_UNARY(Square, x * x, g * (C(2) * x))
TESSEL_UNARY(Reciprocal, C(1) / x, -(g * y * y))
TESSEL_UNARY(Erf, tmath::erf(x), g * (kTwoOverSqrtPi<C> * tmath::exp(-(x * x))))
TESSEL_UNARY(Floor, std::floor(x), C(0))
TESSEL_UNARY(Ceil, std::ceil(x), C(0))
TESSEL_UNARY(Round, round_half_even(x), C(0))
TESSEL_UNARY(LogicalNot, !x, C(0))

#undef TESSEL_UNARY

}  // namespace tessel::kernels
