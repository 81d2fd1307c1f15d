#pragma once
// Softmax and log-softmax along one dimension, forward and backward.
//
// Order of operations (the contract a CUDA port must reproduce bit for bit).
// C is the compute type: float for float16/bfloat16/float32 tensors (16-bit
// values are widened on load and each output is rounded once on store),
// double for float64. Per row x[0..n) along `dim`, with V = `chunks`:
//
//   m    = max_i x_i                      (as a value: exact in any order; a
//                                          zero maximum is +0; NaN if any x_i is NaN)
//   e_i  = tmath::exp(x_i - m)
//   s    = canonical_sum_V(e_0 .. e_{n-1})    (kernels/canonical.h)
//   softmax:      r = C(1) / s;      y_i = e_i * r
//   log_softmax:  L = tmath::log(s); y_i = (x_i - m) - L
//
// Backward, with g the incoming gradient and y the forward output (both
// widened to C):
//   softmax:      p_i = g_i * y_i;  d = canonical_sum_V(p);  dx_i = y_i * (g_i - d)
//   log_softmax:  s = canonical_sum_V(g);                   dx_i = g_i - tmath::exp(y_i) * s
//
// No FMA anywhere (each product is rounded before the add). A row of -inf
// gives NaN (as in PyTorch); a NaN in a row makes the whole row NaN.
// Tensors may have any strides; all share one shape and one floating dtype.
#include <cstdint>

#include "kernels/registry.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

// out = (log_)softmax(x) along dim.
inline KernelTable<void(const Tensor& x, int64_t dim, bool log, const Tensor& out, int chunks)>
    softmax_forward{"softmax_forward"};
// dx from g and the forward output y.
inline KernelTable<void(const Tensor& g, const Tensor& y, int64_t dim, bool log, const Tensor& dx, int chunks)>
    softmax_backward{"softmax_backward"};

}  // namespace tessel::kernels
