#pragma once
// Joining and splitting along a dimension: cat, stack, split, chunk.
#include <cstdint>
#include <vector>

#include "runtime/tensor.h"

namespace tessel {

// Concatenation along `dim`. Inputs must share the device and agree in every
// other dimension; their dtypes promote (promote_types across all inputs).
// As in PyTorch, 1-D empty tensors (shape [0]) are skipped whatever the rank
// of the others. Differentiable w.r.t. every floating-point input.
Tensor cat(const std::vector<Tensor>& xs, int64_t dim = 0);
// Joins same-shaped tensors along a new dimension `dim` (0..rank). Promotes
// dtypes like cat; differentiable w.r.t. every floating-point input.
Tensor stack(const std::vector<Tensor>& xs, int64_t dim = 0);

// Views of consecutive pieces of `split_size` along dim (the last may be
// smaller). Each piece is differentiable.
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);
// Views of consecutive pieces with the given sizes (they must sum to x.size(dim)).
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
// PyTorch's chunk: pieces of ceil(size / chunks) along dim, so there may be
// fewer than `chunks` pieces (chunks empty pieces for an empty dimension).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);

}  // namespace tessel
