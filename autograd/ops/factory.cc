#include "autograd/ops/factory.h"

#include <cmath>
#include <cstring>

#include "dtensor/ops.h"
#include "dtensor/sharding.h"
#include "kernels/elementwise.h"

namespace tessel {

Tensor empty(const Dims& shape, TensorOptions opts) {
  Tensor t = raw::empty(shape, opts.dtype, opts.device);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor full(const Dims& shape, Scalar value, TensorOptions opts) {
  Tensor t = raw::empty(shape, opts.dtype, opts.device);
  kernels::fill(t.device(), t, value);
  if (opts.requires_grad) t.requires_grad_(true);
  return t;
}

Tensor zeros(const Dims& shape, TensorOptions opts) { return full(shape, 0, opts); }
Tensor ones(const Dims& shape, TensorOptions opts) { return full(shape, 1, opts); }

namespace {
TensorOptions like(const Tensor& t) {
  TensorOptions o;
  o.dtype = t.dtype();
  o.device = t.device();
  return o;
}
}  // namespace

// *_like of a distributed tensor: same mesh and layout (a Partial layout
// becomes Replicate where the value would not be a valid pending sum).
Placements like_placements(const Tensor& t, bool keep_partial) {
  return keep_partial ? t.placements() : dtensor::unshard(t.placements(), {}, true);
}

Tensor empty_like(const Tensor& t) {
  if (t.is_distributed()) return empty(t.shape(), t.mesh(), t.placements(), like(t));
  return empty(t.shape(), like(t));
}
Tensor zeros_like(const Tensor& t) {
  if (t.is_distributed()) return zeros(t.shape(), t.mesh(), t.placements(), like(t));
  return zeros(t.shape(), like(t));
}
Tensor ones_like(const Tensor& t) {
  if (t.is_distributed()) return ones(t.shape(), t.mesh(), like_placements(t, false), like(t));
  return ones(t.shape(), like(t));
}
Tensor full_like(const Tensor& t, Scalar v) {
  if (t.is_distributed()) return full(t.shape(), v, t.mesh(), like_placements(t, false), like(t));
  return full(t.shape(), v, like(t));
}
Tensor scalar_tensor(Scalar value, TensorOptions opts) { return full(Dims{}, value, opts); }

Tensor arange(Scalar end) { return arange(Scalar(0), end, Scalar(1)); }

Tensor arange(Scalar start, Scalar end, Scalar step) {
  bool integral = !start.is_floating() && !end.is_floating() && !step.is_floating();
  return arange(start, end, step, TensorOptions(integral ? DType::Int64 : DType::Float32));
}

Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions opts) {
  double s = start.to_double(), e = end.to_double(), st = step.to_double();
  TESSEL_CHECK(st != 0.0, "arange", "step must be nonzero");
  TESSEL_CHECK((st > 0 && e >= s) || (st < 0 && e <= s), "arange",
               "range [{}, {}) with step {} has inconsistent sign", s, e, st);
  int64_t n = int64_t(std::ceil((e - s) / st));
  Tensor host = raw::empty(Dims{n}, opts.dtype, kCPU);
  dispatch_numeric(opts.dtype, "arange", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = host.data<T>();
    bool integral = !start.is_floating() && !step.is_floating();
    for (int64_t i = 0; i < n; ++i) {
      if (integral) {
        p[i] = store<T>(compute_t<T>(start.to_int() + i * step.to_int()));
      } else {
        p[i] = store<T>(compute_t<T>(s + double(i) * st));
      }
    }
  });
  Tensor out = opts.device.is_cpu() ? host : host.to(opts.device);
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}

template <class T>
Tensor tensor(const std::vector<T>& values, const Dims& shape_in, TensorOptions opts) {
  Dims shape = shape_in.empty() ? Dims{int64_t(values.size())} : shape_in;
  TESSEL_CHECK(numel_of(shape) == int64_t(values.size()), "tensor", "{} values do not fill shape {}", values.size(),
               shape);
  Tensor src = raw::empty(shape, dtype_v<T>, kCPU);
  if (!values.empty()) {
    if constexpr (std::is_same_v<T, bool>) {
      bool* p = src.data<bool>();
      for (size_t i = 0; i < values.size(); ++i) p[i] = values[i];
    } else {
      std::memcpy(src.raw_data(), values.data(), values.size() * sizeof(T));
    }
  }
  Tensor out = src;
  if (opts.dtype != dtype_v<T>) out = src.to(opts.dtype);
  if (!opts.device.is_cpu()) out = out.to(opts.device);
  if (opts.requires_grad) out.requires_grad_(true);
  return out;
}

template Tensor tensor<float>(const std::vector<float>&, const Dims&, TensorOptions);
template Tensor tensor<double>(const std::vector<double>&, const Dims&, TensorOptions);
template Tensor tensor<int32_t>(const std::vector<int32_t>&, const Dims&, TensorOptions);
template Tensor tensor<int64_t>(const std::vector<int64_t>&, const Dims&, TensorOptions);
template Tensor tensor<bool>(const std::vector<bool>&, const Dims&, TensorOptions);

Tensor tensor(std::initializer_list<float> values, const Dims& shape, TensorOptions opts) {
  return tensor(std::vector<float>(values), shape, opts);
}

}  // namespace tessel
