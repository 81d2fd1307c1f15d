#include "kernels/unary.h"

namespace tessel::kernels {

const char* unary_op_name(UnaryOp op) {
  static const char* names[] = {"neg",  "abs",     "sign", "exp",  "log",    "log1p",  "expm1",   "sqrt",
                                "rsqrt", "sin",    "cos",  "tanh", "sigmoid", "relu", "gelu",    "gelu_erf",
                                "silu", "square", "reciprocal", "erf", "floor", "ceil", "round", "logical_not"};
  static_assert(sizeof(names) / sizeof(names[0]) == kNumUnaryOps, "unary op names out of sync");
  return names[int(op)];
}

}  // namespace tessel::kernels
