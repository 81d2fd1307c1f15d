#pragma once
// The context of one CUDA kernel call in a KernelTable adapter (host code):
// checks that every (defined) tensor lives on one CUDA device, makes that
// device current for the call and picks the thread's current stream there.
// Errors name the op and the offending tensors.
#include <initializer_list>

#include <cuda_runtime.h>

#include "kernels/cuda/stream.h"
#include "runtime/tensor.h"

namespace tessel::kernels::cuda {

int common_cuda_device(const char* op, std::initializer_list<const Tensor*> tensors);

class CudaCall {
 public:
  CudaCall(const char* op, std::initializer_list<const Tensor*> tensors)
      : op_(op), device_(common_cuda_device(op, tensors)), guard_(device_),
        stream_(tessel::cuda::current_stream(device_)) {}
  cudaStream_t stream() const { return stream_; }
  int device() const { return device_; }
  Device dev() const { return Device(DeviceType::CUDA, device_); }
  const char* op() const { return op_; }

 private:
  const char* op_;
  int device_;
  tessel::cuda::DeviceGuard guard_;
  cudaStream_t stream_;
};

// A device scratch tensor (from the caching allocator, on the current stream).
inline Tensor scratch(const CudaCall& call, const Dims& shape, DType dtype) {
  return raw::empty(shape, dtype, call.dev());
}

// Copies a small device tensor's bytes to the host (synchronises the stream).
void read_back(const CudaCall& call, const Tensor& t, void* host, size_t bytes);
// Copies host bytes into a new contiguous device tensor of `shape` / `dtype`.
Tensor upload(const CudaCall& call, const void* host, const Dims& shape, DType dtype);

}  // namespace tessel::kernels::cuda
