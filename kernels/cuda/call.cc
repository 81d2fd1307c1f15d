#include "kernels/cuda/call.h"

#include "kernels/cuda/staging.h"

namespace tessel::kernels::cuda {

int common_cuda_device(const char* op, std::initializer_list<const Tensor*> tensors) {
  int device = -1;
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t || !t->defined()) continue;
    TESSEL_CHECK(t->device().is_cuda(), op, "expected a CUDA tensor, got {}", t->desc());
    if (device < 0) {
      device = t->device().index;
      first = t;
    } else {
      TESSEL_CHECK(t->device().index == device, op, "tensors on different devices: {} and {}", first->desc(),
                   t->desc());
    }
  }
  TESSEL_CHECK(device >= 0, op, "no CUDA tensor among the arguments");
  return device;
}

void read_back(const CudaCall& call, const Tensor& t, void* host, size_t bytes) {
  TESSEL_CHECK(t.is_contiguous() && t.nbytes() >= bytes, call.op(), "read_back of {} bytes from {}", bytes, t.desc());
  tessel::cuda::copy_device_to_host(host, t.raw_data(), bytes, call.device(), call.stream());
}

Tensor upload(const CudaCall& call, const void* host, const Dims& shape, DType dtype) {
  Tensor t = raw::empty(shape, dtype, call.dev());
  tessel::cuda::copy_host_to_device(t.raw_data(), host, t.nbytes(), call.device(), call.stream());
  return t;
}

}  // namespace tessel::kernels::cuda
