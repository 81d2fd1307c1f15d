#pragma once
// Differentiable indexing: embedding, gather/scatter_add, index_select/index_add,
// triangular masks, one_hot.
//
// Indices are int32 or int64 tensors and are validated: an index outside
// [0, size) raises tessel::Error naming the op, the index value, its position
// and the valid range. Negative indices are errors (no Python-style
// wrap-around). Sums of several contributions into one element (scatter_add,
// index_add with repeated indices, and the backward of embedding, gather and
// index_select) use the segmented canonical order of
// kernels/cpu/segment_sum.h: bit-identical whatever the thread count, and
// reproducible when the indexed dimension is sharded.
#include <cstdint>

#include "runtime/scalar.h"
#include "runtime/tensor.h"

namespace tessel {

// weight [V, D], ids [...] (int32/int64) -> [..., D]: out[..., :] = weight[ids[...], :].
// Differentiable w.r.t. weight: dWeight[v] = canonical sum of the output
// gradients of the positions whose id is v, over the flattened ids in
// row-major order (the token order).
Tensor embedding(const Tensor& weight, const Tensor& ids);

// out[i][j][k] = x[i][index[i][j][k]][k] (for dim = 1); out has index's shape;
// index has x's rank and index.size(d) <= x.size(d) for d != dim.
Tensor gather(const Tensor& x, int64_t dim, const Tensor& index);

// Out-of-place scatter-add: out = x, then out[i][index[i][j][k]][k] += src[i][j][k]
// (dim = 1) for every element of index; only the index-shaped part of src is
// used. Per destination: x + (canonical sum of its contributions), untouched
// elements keep x's bits. src has x's dtype.
Tensor scatter_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src);

// The slices x.select(dim, index[i]) stacked along dim (index 0-D or 1-D).
Tensor index_select(const Tensor& x, int64_t dim, const Tensor& index);

// Out-of-place index_add: out = x, then out.select(dim, index[i]) += alpha * src.select(dim, i).
// Repeated indices sum in the canonical order over i (alpha is applied to
// each contribution first). src has x's dtype.
Tensor index_add(const Tensor& x, int64_t dim, const Tensor& index, const Tensor& src, Scalar alpha = 1);

// Lower / upper triangle of the last two dims: tril keeps j - i <= k, triu
// keeps j - i >= k, the rest is 0.
Tensor tril(const Tensor& x, int64_t k = 0);
Tensor triu(const Tensor& x, int64_t k = 0);

// ids [...] (int32/int64) -> int64 [..., num_classes] with a 1 at each id;
// num_classes = -1 infers max(ids) + 1. Not differentiable.
Tensor one_hot(const Tensor& ids, int64_t num_classes = -1);

}  // namespace tessel
