#pragma once
// Tensor creation. Random factories are in autograd/ops/random.h.
#include <cstdint>
#include <vector>

#include "runtime/tensor.h"

namespace tessel {

Tensor empty(const Dims& shape, TensorOptions opts = {});
Tensor zeros(const Dims& shape, TensorOptions opts = {});
Tensor ones(const Dims& shape, TensorOptions opts = {});
Tensor full(const Dims& shape, Scalar value, TensorOptions opts = {});
Tensor empty_like(const Tensor& t);
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor full_like(const Tensor& t, Scalar value);
// A 0-dim tensor holding `value` (dtype from opts).
Tensor scalar_tensor(Scalar value, TensorOptions opts = {});
// [start, end) with `step`; int64 when all bounds are integers and no dtype is
// given, float32 otherwise (dtype from opts when given explicitly).
Tensor arange(Scalar end);
Tensor arange(Scalar start, Scalar end, Scalar step = 1);
Tensor arange(Scalar start, Scalar end, Scalar step, TensorOptions opts);

// A tensor holding a copy of `values`, with `shape` (default: 1-D).
template <class T>
Tensor tensor(const std::vector<T>& values, const Dims& shape = {}, TensorOptions opts = TensorOptions(dtype_v<T>));
Tensor tensor(std::initializer_list<float> values, const Dims& shape = {}, TensorOptions opts = {});

}  // namespace tessel
