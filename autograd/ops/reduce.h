#pragma once
// Differentiable reductions over any dimensions, in the canonical order
// (docs/numerics.md). `dims` empty means all dimensions.
#include <tuple>
#include <vector>

#include "runtime/tensor.h"

namespace tessel {

// Floating inputs keep their dtype (accumulated in float/double, rounded once);
// integer and bool inputs sum to int64.
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// sum with an explicit canonical chunk count (0: numerics::reduction_chunks()):
// for backward passes that reduce a local piece of a sharded dim (bitwise mode).
Tensor sum_chunks(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim, int chunks);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Largest / smallest value (NaN propagates); gradient shared evenly by ties.
Tensor amax(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor amin(const Tensor& x, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// (values, indices) along one dimension; indices of the first extreme.
std::tuple<Tensor, Tensor> max(const Tensor& x, int64_t dim, bool keepdim = false);
std::tuple<Tensor, Tensor> min(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmax(const Tensor& x, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& x, int64_t dim, bool keepdim = false);
// Variance with Bessel-style `correction` (1: unbiased, 0: population).
Tensor var(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);
Tensor stddev(const Tensor& x, const std::vector<int64_t>& dims = {}, int64_t correction = 1, bool keepdim = false);

}  // namespace tessel
