// The CUDA runtime hooks tessel's core needs: the device count (overriding
// the weak default in runtime/device.cc), a device allocator, and copies
// between host and device.
//
// The allocator is deliberately minimal: cudaMalloc/cudaFree on the current
// device, no caching (a caching, stream-aware allocator is a later issue).
// Copies handle contiguous tensors of one dtype, CPU<->CUDA and CUDA<->CUDA;
// dtype conversion and strided copies on the GPU come with the elementwise
// CUDA kernels.
#include <cuda_runtime.h>

#include <mutex>

#include "kernels/elementwise.h"
#include "runtime/allocator.h"
#include "runtime/device.h"
#include "runtime/error.h"

namespace tessel {

// Strong definition of the hook declared weak in runtime/device.cc.
int tessel_cuda_device_count_hook() {
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error (no driver / no device)
      return 0;
    }
    return n;
  }();
  return count;
}

namespace kernels::cuda {
namespace {

class CudaAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes, Stream) override {
    if (nbytes == 0) return nullptr;
    void* p = nullptr;
    cudaError_t err = cudaMalloc(&p, nbytes);
    if (err != cudaSuccess) {
      cudaGetLastError();
      TESSEL_FAIL("cuda allocator", "cudaMalloc of {} bytes failed: {}", nbytes, cudaGetErrorString(err));
    }
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requests;
    ++stats_.system_allocs;
    stats_.current_bytes += int64_t(nbytes);
    if (stats_.current_bytes > stats_.peak_bytes) stats_.peak_bytes = stats_.current_bytes;
    return p;
  }
  void deallocate(void* p, size_t nbytes, Stream) override {
    if (!p) return;
    cudaFree(p);
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.system_frees;
    stats_.current_bytes -= int64_t(nbytes);
  }
  AllocatorStats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void reset_peak() override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.peak_bytes = stats_.current_bytes;
  }
  void empty_cache() override {}
  Device device() const override { return Device(DeviceType::CUDA, 0); }

 private:
  mutable std::mutex mu_;
  AllocatorStats stats_;
};

const bool g_allocator_registered = [] {
  static CudaAllocator allocator;
  register_allocator(DeviceType::CUDA, &allocator);
  return true;
}();

void copy_cuda(const Tensor& src, const Tensor& dst) {
  TESSEL_CHECK(src.shape() == dst.shape(), "copy", "source {} and destination {} differ in shape", src.desc(),
               dst.desc());
  TESSEL_CHECK(src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous(), "copy",
               "CUDA copies support contiguous tensors of one dtype for now, got {} -> {}", src.desc(), dst.desc());
  TESSEL_CHECK(!src.device().is_meta() && !dst.device().is_meta(), "copy", "cannot copy {} -> {}", src.desc(),
               dst.desc());
  if (dst.nbytes() == 0) return;
  cudaMemcpyKind kind = src.device().is_cpu()   ? (dst.device().is_cpu() ? cudaMemcpyHostToHost : cudaMemcpyHostToDevice)
                        : dst.device().is_cpu() ? cudaMemcpyDeviceToHost
                                                : cudaMemcpyDeviceToDevice;
  cudaError_t err = cudaMemcpy(dst.raw_data(), src.raw_data(), dst.nbytes(), kind);
  TESSEL_CHECK(err == cudaSuccess, "copy", "cudaMemcpy {} -> {} failed: {}", src.desc(), dst.desc(),
               cudaGetErrorString(err));
}

}  // namespace

TESSEL_REGISTER_KERNEL(copy, DeviceType::CUDA, copy_cuda);

}  // namespace kernels::cuda
}  // namespace tessel
