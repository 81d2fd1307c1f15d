#include "kernels/elementwise.h"

namespace tessel::kernels {

const char* binary_op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::Maximum: return "maximum";
    case BinaryOp::Minimum: return "minimum";
    case BinaryOp::Pow: return "pow";
    case BinaryOp::Eq: return "eq";
    case BinaryOp::Ne: return "ne";
    case BinaryOp::Lt: return "lt";
    case BinaryOp::Le: return "le";
    case BinaryOp::Gt: return "gt";
    case BinaryOp::Ge: return "ge";
    case BinaryOp::LogicalAnd: return "logical_and";
    case BinaryOp::LogicalOr: return "logical_or";
    case BinaryOp::LogicalXor: return "logical_xor";
  }
  return "?";
}

}  // namespace tessel::kernels
