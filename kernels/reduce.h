#pragma once
// Reductions over any set of dimensions, in the canonical order of
// kernels/canonical.h (sum, max, min) or exactly (argmax/argmin, integer sums).
#include "kernels/registry.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

enum class ReduceOp : uint8_t { Sum, Max, Min };

// out has x's rank with every reduced dimension of size 1 (keepdim form).
// Floating inputs accumulate in float (double for float64) and round once
// into out's dtype; integer/bool sums accumulate exactly in int64.
// `chunks` is V (a power of two).
inline KernelTable<void(ReduceOp, const Tensor& x, const Tensor& out, int chunks)> reduce{"reduce"};

// Index of the first maximum (minimum) along `dim`; NaN counts as the maximum
// (and the minimum), the first NaN wins. out: int64, keepdim form.
inline KernelTable<void(const Tensor& x, int64_t dim, bool is_max, const Tensor& out)> arg_reduce{"arg_reduce"};

}  // namespace tessel::kernels
