#include "kernels/reduce.h"

namespace tessel::kernels {

KernelTable<void(ReduceOp, const Tensor&, const Tensor&, int)> reduce("reduce");
KernelTable<void(const Tensor&, int64_t, bool, const Tensor&)> arg_reduce("arg_reduce");

}  // namespace tessel::kernels
