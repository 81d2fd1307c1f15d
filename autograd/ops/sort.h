#pragma once
// Sorting along a dimension: sort, argsort, topk.
//
// The order is total and deterministic (kernels/sort.h): NaN is larger than
// every number; equal values keep ascending index order in both directions,
// so `stable` is always honoured (stable = false gives the same result).
// Values are differentiable: their gradient is scattered back to the source
// positions. Indices are int64.
#include <cstdint>
#include <tuple>

#include "runtime/tensor.h"

namespace tessel {

std::tuple<Tensor, Tensor> sort(const Tensor& x, int64_t dim = -1, bool descending = false, bool stable = true);
Tensor argsort(const Tensor& x, int64_t dim = -1, bool descending = false, bool stable = true);
// The k largest (largest = true) or smallest elements along dim: in sort
// order (descending for largest) when `sorted`, else in ascending index order.
std::tuple<Tensor, Tensor> topk(const Tensor& x, int64_t k, int64_t dim = -1, bool largest = true,
                                bool sorted = true);

}  // namespace tessel
