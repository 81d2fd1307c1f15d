#pragma once
// Devices, streams and events (CUDA builds only; docs/cuda.md).
//
// Every kernel tessel launches on device d goes to the calling thread's
// *current stream* for d. By default that is the legacy default stream, which
// orders itself with every other blocking stream (the NCCL backend's streams
// rely on it, runtime/comm/nccl.cc). A StreamGuard makes another stream
// current for a scope; memory allocated inside belongs to that stream in the
// caching allocator (runtime/caching_allocator.h). A tensor used on a second
// stream must be marked with record_stream(), or its memory could be reused
// while that stream still reads it.
#include <cuda_runtime.h>

#include "runtime/caching_allocator.h"
#include "runtime/tensor.h"

namespace tessel::cuda {

int device_count();
int current_device();
// Makes `device` current for its lifetime, restoring the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = -1;
  bool changed_ = false;
};

// The calling thread's current stream on `device` (default: the legacy default stream, 0).
cudaStream_t current_stream(int device);
void set_current_stream(int device, cudaStream_t stream);

class StreamGuard {
 public:
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t prev_;
};

// An owned stream, created blocking (ordered with the legacy default stream).
class Stream {
 public:
  explicit Stream(int device, int priority = 0);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }
  void synchronize() const;

 private:
  int device_;
  cudaStream_t stream_ = nullptr;
};

// An owned event (timing disabled unless asked for).
class Event {
 public:
  explicit Event(bool timing = false);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(cudaStream_t stream);
  // Makes `stream` wait (on the device) for the recorded work.
  void wait(cudaStream_t stream) const;
  void synchronize() const;
  bool query() const;  // true when the recorded work has finished
  // Milliseconds between two recorded timing events (both finished).
  static float elapsed_ms(const Event& start, const Event& end);
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

void synchronize_device(int device);

// The caching allocator serving every CUDA device.
CachingAllocator& allocator();
// The storage of `t` (a CUDA tensor) is used on `stream` too (see above).
void record_stream(const Tensor& t, cudaStream_t stream);
// The device's multiprocessor count (cached).
int sm_count(int device);

}  // namespace tessel::cuda
