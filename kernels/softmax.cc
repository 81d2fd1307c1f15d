#include "kernels/softmax.h"

namespace tessel::kernels {

KernelTable<void(const Tensor&, int64_t, bool, const Tensor&, int)> softmax_forward("softmax_forward");
KernelTable<void(const Tensor&, const Tensor&, int64_t, bool, const Tensor&, int)> softmax_backward(
    "softmax_backward");

}  // namespace tessel::kernels
