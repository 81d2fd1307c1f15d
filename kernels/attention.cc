#include "kernels/attention.h"

namespace tessel::kernels {

KernelTable<void(const Tensor&, const Tensor&, const Tensor&, const AttentionParams&, const Tensor&, const Tensor&)>
    attention_forward("attention_forward");
KernelTable<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const AttentionParams&,
                 const Tensor&, const Tensor&, const Tensor&)>
    attention_backward("attention_backward");
KernelTable<void(const FastAttentionShape&, bool*)> attention_fast_applies("attention_fast_applies");
KernelTable<void(const Tensor&, const Tensor&, const Tensor&, double, const Tensor&, const Tensor&)>
    attention_fast_forward("attention_fast_forward");
KernelTable<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, double,
                 const Tensor&, const Tensor&, const Tensor&)>
    attention_fast_backward("attention_fast_backward");

}  // namespace tessel::kernels
