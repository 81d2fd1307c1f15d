#pragma once
// Per-element optimizer updates, written once for every implementation.
//
// These templates are the contract (docs/optim.md): the CPU kernels
// (kernels/cpu/optim.cc, instantiated with V = float for tails and V = __m256
// for 8 lanes at a time), the scalar references (kernels/cpu/optim_ref.h) and
// a CUDA port (V = float) all evaluate exactly these expressions, in this
// order, with no implicit FMA (-ffp-contract=off on CPU, --fmad=false in
// nvcc). Every operation is an IEEE float32 add, sub, mul, div or sqrt, each
// correctly rounded, so any two implementations agree bit for bit.
//
// V is the value type (float, or a SIMD vector of floats whose operators act
// per lane); coefficients arrive already broadcast to V. Gradients arrive
// widened to float (bf16/f16 -> float is exact).
#include <cmath>

#include "kernels/optim.h"
#include "runtime/macros.h"

namespace tessel::kernels {

struct ScalarSqrt {
  TESSEL_HD float operator()(float x) const { return std::sqrt(x); }
};

// AdamW coefficients as V (AdamWScalars broadcast).
template <class V>
struct AdamWCoef {
  V beta1, one_minus_beta1, beta2, one_minus_beta2, decay, step_size, bias_correction2_sqrt, eps;
};

template <class V, class Bcast>
TESSEL_HD AdamWCoef<V> broadcast_coef(const AdamWScalars& s, Bcast b) {
  return {b(s.beta1), b(s.one_minus_beta1), b(s.beta2),     b(s.one_minus_beta2),
          b(s.decay), b(s.step_size),       b(s.bias_correction2_sqrt), b(s.eps)};
}

// AdamW (decoupled weight decay), one element:
//   m     = beta1 * m + (1 - beta1) * g
//   v     = beta2 * v + (1 - beta2) * (g * g)
//   denom = sqrt(v) / sqrt(1 - beta2^t) + eps
//   p     = p * (1 - lr * wd) - (lr / (1 - beta1^t)) * (m / denom)
// Each line is evaluated left to right as written (products before sums),
// every intermediate rounded to float.
template <class V, class Sqrt>
TESSEL_HOST_DEVICE_INLINE void adamw_update(V& p, V& m, V& v, V g, const AdamWCoef<V>& c, Sqrt sqrt_fn) {
  m = c.beta1 * m + c.one_minus_beta1 * g;
  v = c.beta2 * v + c.one_minus_beta2 * (g * g);
  const V denom = sqrt_fn(v) / c.bias_correction2_sqrt + c.eps;
  p = p * c.decay - c.step_size * (m / denom);
}

template <class V>
struct SGDCoef {
  V lr, weight_decay, momentum, one_minus_dampening;
};

template <class V, class Bcast>
TESSEL_HD SGDCoef<V> broadcast_coef(const SGDScalars& s, Bcast b) {
  return {b(s.lr), b(s.weight_decay), b(s.momentum), b(s.one_minus_dampening)};
}

// SGD with momentum (PyTorch's torch.optim.SGD), one element:
//   d = g                                     (weight_decay == 0)
//   d = g + wd * p                            (weight_decay != 0)
//   with momentum != 0:
//     buf = d                                 (first step: no state yet)
//     buf = momentum * buf + (1 - dampening) * d   (later steps)
//     d   = d + momentum * buf                (nesterov)
//     d   = buf                               (otherwise)
//   p = p - lr * d
// The flags are uniform over a tensor (branches never depend on data).
template <class V>
TESSEL_HOST_DEVICE_INLINE void sgd_update(V& p, V* buf, V g, const SGDCoef<V>& c, const SGDScalars& s) {
  V d = g;
  if (s.use_weight_decay) d = d + c.weight_decay * p;
  if (s.use_momentum) {
    V b = s.first_step ? d : c.momentum * *buf + c.one_minus_dampening * d;
    *buf = b;
    d = s.nesterov ? d + c.momentum * b : b;
  }
  p = p - c.lr * d;
}

// One term of the sum of squares: x widened to float, squared (rounded), then
// summed in the canonical order of kernels/canonical.h.
TESSEL_HOST_DEVICE_INLINE float square_term(float x) { return x * x; }

}  // namespace tessel::kernels
