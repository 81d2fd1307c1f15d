// CPU count of non-finite elements (kernels/nonfinite.h): each thread counts
// its chunks of strided_loop, the counts add up as integers (any order gives
// the same total).
#include <atomic>

#include "kernels/cpu/loops.h"
#include "kernels/nonfinite.h"

namespace tessel::kernels::cpu {
namespace {

template <class T>
int64_t count_typed(const Tensor& x) {
  using C = compute_t<T>;
  std::atomic<int64_t> total{0};
  strided_loop<1>({&x}, kElementwiseGrain, [&total](int64_t n, char* const* p, const int64_t* s) {
    int64_t k = 0;
    for (int64_t i = 0; i < n; ++i) k += nonfinite_value<C>(C(load(*reinterpret_cast<const T*>(p[0] + i * s[0]))));
    if (k) total.fetch_add(k, std::memory_order_relaxed);
  });
  return total.load();
}

// The caller (autograd/anomaly.cc, the tests) has checked dtypes and devices.
void count_nonfinite_cpu(const Tensor& x, const Tensor& count) {
  const int64_t k =
      dispatch_floating(x.dtype(), "count_nonfinite", [&](auto tag) { return count_typed<typename decltype(tag)::type>(x); });
  *static_cast<int64_t*>(count.raw_data()) += k;
}

}  // namespace

TESSEL_REGISTER_KERNEL(count_nonfinite, DeviceType::CPU, count_nonfinite_cpu);

}  // namespace tessel::kernels::cpu
