#include "kernels/attention.h"

namespace tessel::kernels {

KernelTable<void(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, const Tensor&, const Tensor&)>
    attention_forward("attention_forward");
KernelTable<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionParams&,
                 const Tensor&, const Tensor&, const Tensor&)>
    attention_backward("attention_backward");

}  // namespace tessel::kernels
