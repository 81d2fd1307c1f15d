// CPU softplus (kernels/softplus.h): the scalar reference applied element by
// element over any strides, split over threads by strided_loop (elements are
// independent, so the thread count cannot change a bit).
#include "kernels/cpu/loops.h"
#include "kernels/softplus.h"

namespace tessel::kernels::cpu {
namespace {

template <class T>
void softplus_forward_typed(const Tensor& x, double beta, double threshold, const Tensor& out) {
  using C = compute_t<T>;
  const C cb = C(beta), ct = C(threshold);
  strided_loop<2>({&out, &x}, kElementwiseGrain, [cb, ct](int64_t n, char* const* p, const int64_t* s) {
    for (int64_t i = 0; i < n; ++i) {
      const T xi = *reinterpret_cast<const T*>(p[1] + i * s[1]);
      *reinterpret_cast<T*>(p[0] + i * s[0]) = store<T>(softplus_value<C>(C(load(xi)), cb, ct));
    }
  });
}

template <class T>
void softplus_backward_typed(const Tensor& g, const Tensor& x, double beta, double threshold, const Tensor& dx) {
  using C = compute_t<T>;
  const C cb = C(beta), ct = C(threshold);
  strided_loop<3>({&dx, &g, &x}, kElementwiseGrain, [cb, ct](int64_t n, char* const* p, const int64_t* s) {
    for (int64_t i = 0; i < n; ++i) {
      const T gi = *reinterpret_cast<const T*>(p[1] + i * s[1]);
      const T xi = *reinterpret_cast<const T*>(p[2] + i * s[2]);
      *reinterpret_cast<T*>(p[0] + i * s[0]) = store<T>(softplus_grad<C>(C(load(gi)), C(load(xi)), cb, ct));
    }
  });
}

// The op (autograd/ops/softplus.cc) has checked shapes and dtypes.
void softplus_forward_cpu(const Tensor& x, double beta, double threshold, const Tensor& out) {
  dispatch_floating(x.dtype(), "softplus",
                    [&](auto tag) { softplus_forward_typed<typename decltype(tag)::type>(x, beta, threshold, out); });
}

void softplus_backward_cpu(const Tensor& g, const Tensor& x, double beta, double threshold, const Tensor& dx) {
  dispatch_floating(x.dtype(), "softplus_backward", [&](auto tag) {
    softplus_backward_typed<typename decltype(tag)::type>(g, x, beta, threshold, dx);
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(softplus_forward, DeviceType::CPU, softplus_forward_cpu);
TESSEL_REGISTER_KERNEL(softplus_backward, DeviceType::CPU, softplus_backward_cpu);

}  // namespace tessel::kernels::cpu
