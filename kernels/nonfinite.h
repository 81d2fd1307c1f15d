#pragma once
// Counting non-finite values (inf, -inf, NaN): what anomaly detection
// (autograd/anomaly.h) runs over every op's outputs and gradients, and what
// tells a user which tensor first went bad.
//
// Contract: an element is non-finite when its value, widened to the compute
// type (float for 16-bit dtypes, widening keeps inf and NaN), is not equal to
// itself or differs from itself by a non-zero amount (x - x is NaN for
// inf and NaN, 0 for every finite x). Integer counting: every backend and
// thread count gives the same number.
#include "kernels/registry.h"
#include "runtime/macros.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

// The scalar reference, shared by the CPU kernel, the CUDA kernel and the tests.
template <class C>
TESSEL_HOST_DEVICE_INLINE bool nonfinite_value(C x) {
  return x != x || x - x != C(0);
}

// count += the number of non-finite elements of x. x: any floating dtype,
// any strides; count: one int64 element on x's device (so one count can
// collect many tensors).
inline KernelTable<void(const Tensor& x, const Tensor& count)> count_nonfinite{"count_nonfinite"};

}  // namespace tessel::kernels
