#pragma once
// Where a tensor's bytes live. Meta tensors have a shape and dtype but no
// storage: models of any size can be built on Meta for planning.
#include <cstdint>
#include <string>

namespace tessel {

enum class DeviceType : uint8_t { CPU = 0, CUDA = 1, Meta = 2 };
inline constexpr int kNumDeviceTypes = 3;

struct Device {
  DeviceType type = DeviceType::CPU;
  int index = 0;

  constexpr Device() = default;
  constexpr Device(DeviceType t, int i = 0) : type(t), index(i) {}
  static Device parse(const std::string& s);  // "cpu", "cuda", "cuda:1", "meta"

  bool is_cpu() const { return type == DeviceType::CPU; }
  bool is_cuda() const { return type == DeviceType::CUDA; }
  bool is_meta() const { return type == DeviceType::Meta; }
  std::string str() const;
  friend bool operator==(Device a, Device b) { return a.type == b.type && a.index == b.index; }
  friend bool operator!=(Device a, Device b) { return !(a == b); }
};

inline constexpr Device kCPU{DeviceType::CPU, 0};
inline constexpr Device kMeta{DeviceType::Meta, 0};

const char* device_type_name(DeviceType t);

// Is a CUDA device usable in this process (built with CUDA and a GPU present)?
bool cuda_available();
int cuda_device_count();
// Waits until the work queued on the device (every stream) has finished; a
// no-op for CPU and Meta. Benchmarks and host timing need it on CUDA.
void synchronize(Device d);

// An ordered queue of work on a device. CPU work is synchronous, so the CPU
// stream is a token; CUDA streams wrap cudaStream_t (see kernels/cuda).
struct Stream {
  Device device;
  void* handle = nullptr;  // cudaStream_t for CUDA, null = default stream
};

}  // namespace tessel
