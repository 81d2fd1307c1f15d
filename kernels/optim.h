#pragma once
// Fused optimizer kernels and the reductions gradient clipping needs.
//
// Each update kernel reads and writes param, grad-derived state and param in
// one pass per tensor, parallel over elements (no reductions, so the result
// never depends on threads or layout). The per-element expressions are in
// kernels/optim_math.h; the float coefficients they use are computed on the
// host, once per tensor and step, by adamw_scalars / sgd_scalars below
// (double arithmetic with IEEE operations only, rounded once to float), so a
// CUDA kernel given the same AdamWScalars produces the same bits.
//
// Dtypes: param and state float32 (master weights); grad float32, bfloat16 or
// float16 (widened to float exactly). All operands have the same shape and
// any strides. Nothing is allocated.
#include <cstdint>

#include "kernels/registry.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

struct AdamWScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float decay;                  // 1 - lr * weight_decay
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  float eps;
};

// Host side: each value is computed in double from the options and rounded
// once to float; beta^t by repeated squaring (t >= 1), not libm's pow.
AdamWScalars adamw_scalars(double lr, double beta1, double beta2, double eps, double weight_decay, int64_t step);

struct SGDScalars {
  float lr, weight_decay, momentum, one_minus_dampening;
  bool use_weight_decay;  // weight_decay != 0
  bool use_momentum;      // momentum != 0 (a momentum buffer is passed)
  bool nesterov;
  bool first_step;        // the momentum buffer holds no state yet: buf = d
};

SGDScalars sgd_scalars(double lr, double momentum, double dampening, double weight_decay, bool nesterov,
                       bool first_step);

// x^n for n >= 0 by repeated squaring in double (deterministic everywhere).
double ipow(double x, int64_t n);

// In place: param, exp_avg, exp_avg_sq updated from grad (optim_math.h: adamw_update).
inline KernelTable<void(const Tensor& param, const Tensor& grad, const Tensor& exp_avg, const Tensor& exp_avg_sq,
                        const AdamWScalars& s)>
    adamw_step{"adamw_step"};

// In place: param (and momentum_buf when s.use_momentum; undefined otherwise)
// updated from grad (optim_math.h: sgd_update).
inline KernelTable<void(const Tensor& param, const Tensor& grad, const Tensor& momentum_buf, const SGDScalars& s)>
    sgd_step{"sgd_step"};

// out (one float32 element) = canonical sum over the elements of x (in
// row-major order) of float(x)^2, V = chunks (kernels/canonical.h, with
// square_term as the element value). x: contiguous float32, bfloat16 or
// float16. No full-size temporary.
inline KernelTable<void(const Tensor& x, int chunks, const Tensor& out)> sum_squares{"sum_squares"};

// In place: x = x * s, computed in float and rounded once to x's dtype
// (float32, bfloat16, float16; any strides).
inline KernelTable<void(const Tensor& x, float s)> scale_inplace{"scale_inplace"};

}  // namespace tessel::kernels
