#include "autograd/ops/common.h"

namespace tessel::detail {

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  TESSEL_CHECK(a.device() == b.device(), op, "tensors are on different devices: {} and {}", a.desc(), b.desc());
}

void check_floating(const char* op, const Tensor& t) {
  TESSEL_CHECK(is_floating(t.dtype()), op, "expected a floating-point tensor, got {}", t.desc());
}

Tensor cast_raw(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = raw::empty(t.shape(), dtype, t.device());
  kernels::copy(t.device(), t, out);
  return out;
}

Tensor contiguous_raw(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = raw::empty(t.shape(), t.dtype(), t.device());
  kernels::copy(t.device(), t, out);
  return out;
}

Tensor scalar_raw(Scalar value, DType dtype, Device device) {
  Tensor out = raw::empty(Dims{}, dtype, device);
  kernels::fill(device, out, value);
  return out;
}

}  // namespace tessel::detail
