#include "kernels/norm.h"

namespace tessel::kernels {

KernelTable<void(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&, const Tensor&, int)>
    layer_norm_forward("layer_norm_forward");
KernelTable<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                 const Tensor&, const Tensor&, int)>
    layer_norm_backward("layer_norm_backward");
KernelTable<void(const Tensor&, const Tensor&, double, const Tensor&, const Tensor&, int)> rms_norm_forward(
    "rms_norm_forward");
KernelTable<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int)>
    rms_norm_backward("rms_norm_backward");

}  // namespace tessel::kernels
