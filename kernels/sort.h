#pragma once
// Sorting kernels: sort (always stable) and topk along one dimension.
//
// Order: ascending sorts put NaN after every number, descending sorts put it
// first (NaN counts as larger than everything, as in PyTorch); -0 and +0 are
// equal. Equal values (and NaNs among themselves) keep ascending index order
// in both directions, so the result is one well-defined permutation: no
// thread, tiling or algorithm choice can change it. Values are compared in
// their compute type (16-bit floats as float).
#include <cstdint>

#include "kernels/registry.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

// values/indices (int64) have x's shape; any strides, any dtype.
inline KernelTable<void(const Tensor& x, int64_t dim, bool descending, const Tensor& values, const Tensor& indices)>
    sort{"sort"};

// The k largest (smallest) elements along dim, in the sort order above when
// `sorted`, else in ascending index order. values/indices have x's shape with
// dim of size k (0 <= k <= x.size(dim)).
inline KernelTable<void(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted, const Tensor& values,
                        const Tensor& indices)>
    topk{"topk"};

}  // namespace tessel::kernels
