#pragma once
// Indexing kernels: indexed loads (gather, index_select, embedding), the
// deterministic scatter-adds (scatter_add, index_add, and the backward of the
// loads), index validation, and triangular masks.
//
// Index tensors are int32 or int64. The ops validate every index with
// `index_bounds` before calling a kernel (so errors are deterministic and name
// the op); the kernels still check defensively and throw rather than read or
// write out of bounds.
//
// Every sum of several contributions into one destination follows the
// segmented canonical order of kernels/cpu/segment_sum.h: for destination r,
// the canonical sum (kernels/canonical.h, `chunks` = V) over the indexed
// dimension's T source positions, where positions whose index is not r
// contribute +0. No atomics; results never depend on threads.
#include <cstdint>

#include "kernels/registry.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

// First (row-major) element of `index` that is < 0 or >= limit: its linear
// position in *bad_pos and its value in *bad_value; *bad_pos = -1 if none.
inline KernelTable<void(const Tensor& index, int64_t limit, int64_t* bad_pos, int64_t* bad_value)>
    index_bounds{"index_bounds"};

// Indexed load: out[p] = src[p + index[p] * step] for every element p, where
// `src` is a view with out's shape positioned at coordinate 0 of the indexed
// dimension (stride 0 there), `index` a view with out's shape (broadcast with
// zero strides as needed) and `step` the element stride of the indexed
// dimension; indices must lie in [0, limit). gather, index_select and
// embedding forward are all this with different views. Any strides, any dtype.
inline KernelTable<void(const Tensor& src, const Tensor& index, int64_t step, int64_t limit, const Tensor& out)>
    gather_strided{"gather_strided"};

// Row-segmented sum along `dim` with one 1-D index (index_add; the backward of
// index_select and embedding): with out seen as [O, R, I] and src as
// [O, T, I] (T = index.numel()),
//   out[o, r, i] = (accumulate ? out[o, r, i] : 0) + S,
//   S = segmented canonical sum over t of src[o, t, i] where index[t] == r.
// Destinations no index hits are left as they are (accumulate) or set to 0.
// out and src must be contiguous (the ops make them so); index any stride.
// Numeric dtypes; 16-bit floats accumulate in float and round once.
inline KernelTable<void(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, int chunks,
                        bool accumulate)>
    index_add{"index_add"};

// Element-segmented sum (scatter_add; the backward of gather): index has the
// rank of out and src, index.size(d) <= src.size(d) for every d and
// <= out.size(d) for d != dim; only the index-shaped part of src is read. For
// every line of index along `dim` (T = index.size(dim) positions),
//   out[.., r, ..] = (accumulate ? out[.., r, ..] : 0) + S,
//   S = segmented canonical sum over t of src[.., t, ..] where index[.., t, ..] == r.
// In assign mode (accumulate = false) all of out is first set to 0. Any
// strides; numeric dtypes.
inline KernelTable<void(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, int chunks,
                        bool accumulate)>
    scatter_add{"scatter_add"};

// out = x with the elements outside the band zeroed, over the last two dims
// (row i, column j): upper keeps j - i >= k (triu), lower keeps j - i <= k
// (tril). Any strides, any dtype; out may not alias x partially.
inline KernelTable<void(const Tensor& x, int64_t k, bool upper, const Tensor& out)> triangle{"triangle"};

}  // namespace tessel::kernels
