#include "runtime/device.h"

#include <cstdlib>

#include "runtime/error.h"

namespace tessel {

const char* device_type_name(DeviceType t) {
  switch (t) {
    case DeviceType::CPU: return "cpu";
    case DeviceType::CUDA: return "cuda";
    case DeviceType::Meta: return "meta";
  }
  return "?";
}

std::string Device::str() const {
  if (type == DeviceType::CUDA) return "cuda:" + std::to_string(index);
  return device_type_name(type);
}

Device Device::parse(const std::string& s) {
  if (s == "cpu") return kCPU;
  if (s == "meta") return kMeta;
  if (s == "cuda") return Device(DeviceType::CUDA, 0);
  if (s.rfind("cuda:", 0) == 0) {
    char* end = nullptr;
    long i = std::strtol(s.c_str() + 5, &end, 10);
    if (end && *end == 0 && end != s.c_str() + 5 && i >= 0) return Device(DeviceType::CUDA, int(i));
  }
  TESSEL_FAIL("device", "cannot parse device '{}' (expected cpu, meta, cuda or cuda:N)", s);
}

// Weak hook: the CUDA runtime library (kernels/cuda) provides the real count.
__attribute__((weak)) int tessel_cuda_device_count_hook() { return 0; }

int cuda_device_count() { return tessel_cuda_device_count_hook(); }
bool cuda_available() { return cuda_device_count() > 0; }

__attribute__((weak)) void tessel_cuda_synchronize_hook(int) {}

void synchronize(Device d) {
  if (d.is_cuda()) tessel_cuda_synchronize_hook(d.index);
}

}  // namespace tessel
