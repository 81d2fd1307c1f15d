// Fused elementwise chains as one CUDA kernel: the FusedBackend of
// runtime/capture.h (docs/compile.md, "Fusion"). Each thread runs every step
// of the chain for its elements (kernels/fused_chain.h, the same code the
// CPU tests run on the host against the unfused kernels), on the caller's
// current stream. No allocation, no host synchronisation.
#include <cuda_runtime.h>

#include "kernels/cuda/check.h"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/stream.h"
#include "kernels/fused_chain.h"
#include "runtime/capture.h"

namespace tessel::kernels::cuda {
namespace {

__global__ void __launch_bounds__(kThreads) fused_chain_kernel(const capture::FusedProgram p) {
  const int64_t n = p.rows * p.cols;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < n; e += step) {
    const int64_t r = e / p.cols;
    fused_eval(p, r, e - r * p.cols);
  }
}

class CudaFusedBackend final : public capture::FusedBackend {
 public:
  void launch(Device device, const capture::FusedProgram& p) override {
    tessel::cuda::DeviceGuard guard(device.index);
    const int64_t n = p.rows * p.cols;
    if (n == 0) return;
    fused_chain_kernel<<<grid_blocks(n), kThreads, 0, tessel::cuda::current_stream(device.index)>>>(p);
    TESSEL_CUDA_CHECK_LAUNCH("compile: a fused chain");
  }
};

const bool g_registered = [] {
  register_fusion();
  static CudaFusedBackend backend;
  capture::set_fused_backend(DeviceType::CUDA, &backend);
  return true;
}();

}  // namespace
}  // namespace tessel::kernels::cuda
