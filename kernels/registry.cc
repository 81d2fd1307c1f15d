#include "kernels/registry.h"

namespace tessel::kernels {

void throw_missing_kernel(const char* name, Device d) {
  TESSEL_FAIL(name, "no kernel for device {} in this build{}", d.str(),
              d.is_cuda() ? " (built without CUDA, or this kernel has no CUDA implementation yet)" : "");
}

}  // namespace tessel::kernels
