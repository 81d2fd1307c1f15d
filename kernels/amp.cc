#include "kernels/amp.h"

namespace tessel::kernels {

KernelTable<void(const Tensor&, const Tensor&, float)> amp_unscale("amp_unscale");

}  // namespace tessel::kernels
