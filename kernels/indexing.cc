#include "kernels/indexing.h"

namespace tessel::kernels {

KernelTable<void(const Tensor&, int64_t, int64_t*, int64_t*)> index_bounds("index_bounds");
KernelTable<void(const Tensor&, const Tensor&, int64_t, int64_t, const Tensor&)> gather_strided("gather_strided");
KernelTable<void(const Tensor&, int64_t, const Tensor&, const Tensor&, int, bool)> index_add("index_add");
KernelTable<void(const Tensor&, int64_t, const Tensor&, const Tensor&, int, bool)> scatter_add("scatter_add");
KernelTable<void(const Tensor&, int64_t, bool, const Tensor&)> triangle("triangle");

}  // namespace tessel::kernels
