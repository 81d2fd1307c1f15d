#include "kernels/sort.h"

namespace tessel::kernels {

KernelTable<void(const Tensor&, int64_t, bool, const Tensor&, const Tensor&)> sort("sort");
KernelTable<void(const Tensor&, int64_t, int64_t, bool, bool, const Tensor&, const Tensor&)> topk("topk");

}  // namespace tessel::kernels
