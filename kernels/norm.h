#pragma once
// LayerNorm and RMSNorm over the last dimension of a [M, N] matrix (the op
// flattens the normalised dims into N and the leading dims into M).
//
// Order of operations (the contract for every backend). C is float for
// float16/bfloat16/float32 inputs (16-bit values widen on load, outputs round
// once on store) and double for float64; eps is rounded to C; N is C(N).
// Per row x[0..N) with V = `chunks`:
//
//   layer_norm:
//     mean = canonical_sum_V(x) / N
//     var  = canonical_sum_V((x_i - mean) * (x_i - mean)) / N     (two-pass, population variance)
//     rstd = C(1) / sqrt(var + eps)                                (IEEE sqrt, then an IEEE divide)
//     y_i  = ((x_i - mean) * rstd) * w_i + b_i                     (the * w_i / + b_i only when given)
//   rms_norm:
//     rstd = C(1) / sqrt(canonical_sum_V(x_i * x_i) / N + eps)
//     y_i  = (x_i * rstd) * w_i
//
// Backward, with g the incoming gradient:
//     xhat_i = (x_i - mean) * rstd        (rms: x_i * rstd) — the forward's expression
//     gw_i   = g_i * w_i                  (g_i when there is no weight)
//     A      = canonical_sum_V(gw) / N                             (layer_norm only)
//     B      = canonical_sum_V(gw_i * xhat_i) / N
//     dx_i   = ((gw_i - A) - xhat_i * B) * rstd                    (rms: (gw_i - xhat_i * B) * rstd)
//   and over the M rows (tokens — a dimension a distributed run shards), per column j:
//     dweight_j = canonical_sum_V over t of (g_tj * xhat_tj)
//     dbias_j   = canonical_sum_V over t of g_tj
// No FMA anywhere.
//
// Layout: x, g, y, dx are contiguous [M, N]; weight, bias, dweight, dbias are
// contiguous [N] with x's dtype; mean and rstd are contiguous [M] in C's dtype
// (float32, or float64 for float64 inputs). Undefined tensors mean "absent"
// (no weight / bias; gradient not wanted).
#include <cstdint>

#include "kernels/registry.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

inline KernelTable<void(const Tensor& x, const Tensor& weight, const Tensor& bias, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, int chunks)>
    layer_norm_forward{"layer_norm_forward"};
inline KernelTable<void(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& mean,
                        const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias, int chunks)>
    layer_norm_backward{"layer_norm_backward"};
inline KernelTable<void(const Tensor& x, const Tensor& weight, double eps, const Tensor& y, const Tensor& rstd,
                        int chunks)>
    rms_norm_forward{"rms_norm_forward"};
inline KernelTable<void(const Tensor& g, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dx,
                        const Tensor& dweight, int chunks)>
    rms_norm_backward{"rms_norm_backward"};

}  // namespace tessel::kernels
