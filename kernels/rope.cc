#include "kernels/rope.h"

namespace tessel::kernels {

KernelTable<void(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t, bool, bool, const Tensor&)>
    rope_apply("rope_apply");

}  // namespace tessel::kernels
