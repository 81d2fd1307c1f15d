#include "kernels/matmul.h"

namespace tessel::kernels {

KernelTable<void(const Tensor&, const Tensor&, const Tensor&, bool, int)> bmm("bmm");

}  // namespace tessel::kernels
