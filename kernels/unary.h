#pragma once
// Unary elementwise kernels and their backward. The scalar formulas are in
// kernels/unary_math.h, shared by the CPU and CUDA implementations, so both
// evaluate exactly the same expression per element.
#include <cstdint>

#include "kernels/registry.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

enum class UnaryOp : uint8_t {
  Neg, Abs, Sign, Exp, Log, Log1p, Expm1, Sqrt, Rsqrt, Sin, Cos, Tanh, Sigmoid, Relu,
  Gelu,     // tanh approximation (GPT-2)
  GeluErf,  // exact: 0.5 x (1 + erf(x / sqrt 2))
  Silu, Square, Reciprocal, Erf, Floor, Ceil, Round,
  LogicalNot,  // bool -> bool
};
inline constexpr int kNumUnaryOps = int(UnaryOp::LogicalNot) + 1;
const char* unary_op_name(UnaryOp op);
// Ops whose derivative is zero almost everywhere (no gradient flows).
constexpr bool is_piecewise_constant(UnaryOp op) {
  return op == UnaryOp::Sign || op == UnaryOp::Floor || op == UnaryOp::Ceil || op == UnaryOp::Round ||
         op == UnaryOp::LogicalNot;
}

// out = op(x); x and out have the same shape and dtype (Neg/Abs/Sign/Square
// also accept integers; the rest are floating point).
inline KernelTable<void(UnaryOp, const Tensor& x, const Tensor& out)> unary{"unary", capture::Access::Elementwise};
// dx = op'(x) * g, written to dx. y = op(x) is passed too (some derivatives
// are cheaper from the output). All floating, same shape and dtype.
inline KernelTable<void(UnaryOp, const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& dx)>
    unary_backward{"unary_backward", capture::Access::Elementwise};

}  // namespace tessel::kernels
