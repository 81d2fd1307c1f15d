#pragma once
// Softplus, forward and backward: the example kernel family that
// docs/adding_an_op.md walks through. A family is this header (its tables and
// its arithmetic), one CPU file (kernels/cpu/softplus.cc) and one CUDA file
// (kernels/cuda/softplus.cu).
//
// Order of operations (the contract every backend reproduces bit for bit;
// for float64, tmath forwards to each platform's libm, so within an ulp).
// C is the compute type: float for float16/bfloat16/float32 tensors (16-bit
// values are widened on load and each output is rounded once on store),
// double for float64. beta and threshold are rounded to C once. Per element:
//
//   b = beta * x
//   forward:   y  = b > threshold ? x : tmath::log1p(tmath::exp(b)) / beta
//   backward:  dx = b > threshold ? g : g * (e / (e + 1)),  e = tmath::exp(b)
//
// PyTorch's definition (the linear branch keeps large inputs exact). Every
// element is independent: no reduction, nothing canonical to follow.
#include "kernels/registry.h"
#include "runtime/macros.h"
#include "runtime/tensor.h"
#include "runtime/tmath.h"

namespace tessel::kernels {

// The scalar reference: the contract above, shared by the CPU kernel, the
// CUDA kernel and the tests.
template <class C>
TESSEL_HOST_DEVICE_INLINE C softplus_value(C x, C beta, C threshold) {
  const C b = beta * x;
  return b > threshold ? x : tmath::log1p(tmath::exp(b)) / beta;
}

template <class C>
TESSEL_HOST_DEVICE_INLINE C softplus_grad(C g, C x, C beta, C threshold) {
  const C b = beta * x;
  if (b > threshold) return g;
  const C e = tmath::exp(b);
  return g * (e / (e + C(1)));
}

// out = softplus(x); x and out share shape and floating dtype, any strides.
inline KernelTable<void(const Tensor& x, double beta, double threshold, const Tensor& out)> softplus_forward{"softplus_forward", capture::Access::Elementwise};
// dx = softplus'(x) * g; g, x and dx share shape and floating dtype.
inline KernelTable<void(const Tensor& g, const Tensor& x, double beta, double threshold, const Tensor& dx)>
    softplus_backward{"softplus_backward", capture::Access::Elementwise};

}  // namespace tessel::kernels
