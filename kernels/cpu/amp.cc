// CPU gradient unscale with the inf/NaN check (kernels/amp.h).
#include <atomic>
#include <cmath>

#include "kernels/amp.h"
#include "kernels/cpu/loops.h"

namespace tessel::kernels::cpu {
namespace {

void amp_unscale_cpu(const Tensor& x, const Tensor& found_inf, float inv_scale) {
  TESSEL_CHECK(found_inf.numel() == 1 && found_inf.dtype() == DType::Float32, "amp_unscale",
               "found_inf must be one float32 element, got {}", found_inf.desc());
  std::atomic<bool> bad{false};
  auto run = [&](auto tag) {
    using T = typename decltype(tag)::type;
    strided_loop<1>({&x}, kElementwiseGrain, [&](int64_t n, char* const* ptr, const int64_t* st) {
      T* a = reinterpret_cast<T*>(ptr[0]);
      const int64_t s0 = st[0] / int64_t(sizeof(T));
      bool local = false;
      for (int64_t i = 0; i < n; ++i) {
        const float v = float(a[i * s0]);
        local = local || !std::isfinite(v);
        a[i * s0] = store<T>(v * inv_scale);
      }
      if (local) bad.store(true, std::memory_order_relaxed);
    });
  };
  switch (x.dtype()) {
    case DType::Float32: run(TypeTag<float>{}); break;
    case DType::BFloat16: run(TypeTag<bf16>{}); break;
    case DType::Float16: run(TypeTag<f16>{}); break;
    default: throw_unsupported_dtype("amp_unscale", x.dtype(), "float32, bfloat16 or float16");
  }
  if (bad.load()) *static_cast<float*>(found_inf.raw_data()) = 1.0f;
}

}  // namespace

TESSEL_REGISTER_KERNEL(amp_unscale, DeviceType::CPU, amp_unscale_cpu);

}  // namespace tessel::kernels::cpu
