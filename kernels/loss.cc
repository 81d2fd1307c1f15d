#include "kernels/loss.h"

namespace tessel::kernels {

KernelTable<void(const Tensor&, int64_t, int64_t, const char*)> check_targets("check_targets");
KernelTable<void(const Tensor&, const Tensor&, int64_t, double, const Tensor&, const Tensor&, const Tensor&,
                 const Tensor&, int)>
    cross_entropy_forward("cross_entropy_forward");
KernelTable<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t,
                 double, LossReduction, const Tensor&)>
    cross_entropy_backward("cross_entropy_backward");
KernelTable<void(const Tensor&, const Tensor&, int64_t, const Tensor&, const Tensor&)> nll_loss_forward(
    "nll_loss_forward");
KernelTable<void(const Tensor&, const Tensor&, const Tensor&, int64_t, LossReduction, const Tensor&)>
    nll_loss_backward("nll_loss_backward");
KernelTable<void(const Tensor&, const Tensor&, bool, const Tensor&, int)> loss_reduce("loss_reduce");

}  // namespace tessel::kernels
