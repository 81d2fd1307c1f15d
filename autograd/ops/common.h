#pragma once
// Helpers shared by op implementations (not part of the public API).
#include "kernels/elementwise.h"
#include "runtime/tensor.h"

namespace tessel::detail {

// Errors unless every defined tensor is on the same device as the first.
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_floating(const char* op, const Tensor& t);
// `t` converted to dtype (no autograd; returns t itself if already that dtype).
Tensor cast_raw(const Tensor& t, DType dtype);
// A new contiguous tensor with t's values (no autograd).
Tensor contiguous_raw(const Tensor& t);
// A 0-dim tensor on `device` holding `value` as `dtype`.
Tensor scalar_raw(Scalar value, DType dtype, Device device);

}  // namespace tessel::detail
