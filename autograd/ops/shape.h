#pragma once
// Differentiable layout ops as free functions (the same as the Tensor methods).
#include "runtime/tensor.h"

namespace tessel {

inline Tensor reshape(const Tensor& x, const Dims& shape) { return x.reshape(shape); }
inline Tensor transpose(const Tensor& x, int64_t d0, int64_t d1) { return x.transpose(d0, d1); }
inline Tensor permute(const Tensor& x, const Dims& order) { return x.permute(order); }
inline Tensor unsqueeze(const Tensor& x, int64_t dim) { return x.unsqueeze(dim); }
inline Tensor squeeze(const Tensor& x, int64_t dim) { return x.squeeze(dim); }
inline Tensor flatten(const Tensor& x, int64_t start = 0, int64_t end = -1) { return x.flatten(start, end); }
inline Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) { return x.narrow(dim, start, length); }
inline Tensor contiguous(const Tensor& x) { return x.contiguous(); }

}  // namespace tessel
