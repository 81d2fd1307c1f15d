#include "autograd/ops/unary.h"

#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "dtensor/sharding.h"
#include "kernels/unary.h"

namespace tessel {

using kernels::UnaryOp;

namespace {

struct UnaryMathOp {
  static constexpr const char* kName = "unary";
  UnaryOp op;
  const char* name() const { return kernels::unary_op_name(op); }
  SavedTensor x, y;

  Tensor forward(const Tensor& in) {
    const char* name = kernels::unary_op_name(op);
    Tensor src = in;
    bool int_ok = op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Sign || op == UnaryOp::Square;
    if (!is_floating(in.dtype())) {
      TESSEL_CHECK(in.dtype() != DType::Bool || op == UnaryOp::LogicalNot, name, "not defined for bool tensor {}",
                   in.desc());
      if (!int_ok) src = detail::cast_raw(in, DType::Float32);  // exp(int) -> float32, as in PyTorch
    }
    Tensor out = raw::empty(src.shape(), src.dtype(), src.device());
    kernels::unary(src.device(), op, src, out);
    if (!kernels::is_piecewise_constant(op)) {
      x = src;
      y = out;
    }
    return out;
  }

  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) {
    if (kernels::is_piecewise_constant(op)) return {Tensor()};
    const Tensor& xs = x.get();
    Tensor g = detail::cast_raw(grads[0], xs.dtype());
    Tensor dx = raw::empty(xs.shape(), xs.dtype(), xs.device());
    kernels::unary_backward(xs.device(), op, g, xs, y.get(), dx);
    return {dx};
  }

  ShardingPlan sharding(const ShardingContext& ctx) {
    return op == UnaryOp::Neg ? dtensor::pointwise_exact(ctx, {0b1}, true) : dtensor::pointwise(ctx);
  }
};

struct LogicalNotOp {
  static constexpr const char* kName = "logical_not";
  Tensor forward(const Tensor& a) {
    Tensor b = detail::cast_raw(a, DType::Bool);
    Tensor out = raw::empty(b.shape(), DType::Bool, b.device());
    kernels::unary(b.device(), UnaryOp::LogicalNot, b, out);
    return out;
  }
  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>&) { return {Tensor()}; }
  ShardingPlan sharding(const ShardingContext& ctx) { return dtensor::pointwise(ctx); }
};

Tensor unary_op(UnaryOp op, const Tensor& x) { return call(UnaryMathOp{op}, x); }

}  // namespace

Tensor neg(const Tensor& x) { return unary_op(UnaryOp::Neg, x); }
Tensor abs(const Tensor& x) { return unary_op(UnaryOp::Abs, x); }
Tensor sign(const Tensor& x) { return unary_op(UnaryOp::Sign, x); }
Tensor exp(const Tensor& x) { return unary_op(UnaryOp::Exp, x); }
Tensor log(const Tensor& x) { return unary_op(UnaryOp::Log, x); }
Tensor log1p(const Tensor& x) { return unary_op(UnaryOp::Log1p, x); }
Tensor expm1(const Tensor& x) { return unary_op(UnaryOp::Expm1, x); }
Tensor sqrt(const Tensor& x) { return unary_op(UnaryOp::Sqrt, x); }
Tensor rsqrt(const Tensor& x) { return unary_op(UnaryOp::Rsqrt, x); }
Tensor sin(const Tensor& x) { return unary_op(UnaryOp::Sin, x); }
Tensor cos(const Tensor& x) { return unary_op(UnaryOp::Cos, x); }
Tensor tanh(const Tensor& x) { return unary_op(UnaryOp::Tanh, x); }
Tensor sigmoid(const Tensor& x) { return unary_op(UnaryOp::Sigmoid, x); }
Tensor relu(const Tensor& x) { return unary_op(UnaryOp::Relu, x); }
Tensor silu(const Tensor& x) { return unary_op(UnaryOp::Silu, x); }
Tensor square(const Tensor& x) { return unary_op(UnaryOp::Square, x); }
Tensor reciprocal(const Tensor& x) { return unary_op(UnaryOp::Reciprocal, x); }
Tensor erf(const Tensor& x) { return unary_op(UnaryOp::Erf, x); }
Tensor floor(const Tensor& x) { return unary_op(UnaryOp::Floor, x); }
Tensor ceil(const Tensor& x) { return unary_op(UnaryOp::Ceil, x); }
Tensor round(const Tensor& x) { return unary_op(UnaryOp::Round, x); }

Tensor gelu(const Tensor& x, const std::string& approximate) {
  if (approximate == "tanh") return unary_op(UnaryOp::Gelu, x);
  if (approximate == "none") return unary_op(UnaryOp::GeluErf, x);
  TESSEL_FAIL("gelu", "approximate must be \"tanh\" or \"none\", got \"{}\"", approximate);
}

Tensor swiglu(const Tensor& gate, const Tensor& up) {
  TESSEL_CHECK(gate.shape() == up.shape(), "swiglu", "gate {} and up {} must have the same shape", gate.desc(),
               up.desc());
  return silu(gate) * up;
}

Tensor logical_not(const Tensor& a) {
  if (a.is_distributed()) return call(LogicalNotOp{}, a);
  return LogicalNotOp{}.forward(a);
}

}  // namespace tessel
