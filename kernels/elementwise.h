#pragma once
// Elementwise kernels: unary, binary, ternary (where), copy/cast and fill.
//
// Contract for every table here: all tensor arguments have the same shape
// (callers broadcast with raw::expand, which gives zero strides), arbitrary
// strides, and the output is written element by element with no reduction,
// so results never depend on layout, threads or tiling.
#include <cstdint>

#include "kernels/registry.h"
#include "runtime/scalar.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

enum class BinaryOp : uint8_t {
  // Arithmetic: a, b and out share one dtype.
  Add, Sub, Mul, Div, Maximum, Minimum, Pow,
  // Comparisons: a and b share a dtype, out is bool.
  Eq, Ne, Lt, Le, Gt, Ge,
  // Logical: a, b and out are bool.
  LogicalAnd, LogicalOr, LogicalXor,
};
const char* binary_op_name(BinaryOp op);
constexpr bool is_comparison(BinaryOp op) { return op >= BinaryOp::Eq && op <= BinaryOp::Ge; }
constexpr bool is_logical(BinaryOp op) { return op >= BinaryOp::LogicalAnd; }

// out = op(a, b).
inline KernelTable<void(BinaryOp, const Tensor&, const Tensor&, const Tensor&)> binary{"binary", capture::Access::Elementwise};

// dst = src, converting dtype (16-bit floats round to nearest even; float to
// int truncates; to bool is != 0).
inline KernelTable<void(const Tensor& src, const Tensor& dst)> copy{"copy", capture::Access::Elementwise};

// dst[...] = value converted to dst's dtype.
inline KernelTable<void(const Tensor& dst, Scalar value)> fill{"fill", capture::Access::Elementwise};

// out = cond ? a : b (cond bool; a, b, out one dtype).
inline KernelTable<void(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out)> where{"where", capture::Access::Elementwise};

}  // namespace tessel::kernels
