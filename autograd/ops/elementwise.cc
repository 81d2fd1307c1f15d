#include "autograd/ops/elementwise.h"

#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "dtensor/sharding.h"
#include "kernels/elementwise.h"
#include "runtime/numerics.h"

namespace tessel {

using kernels::BinaryOp;

namespace {

DType arithmetic_dtype(BinaryOp op, DType a, DType b) {
  DType t = promote_types(a, b);
  if ((op == BinaryOp::Div || op == BinaryOp::Pow) && !is_floating(t)) t = DType::Float32;
  return t;
}

// Runs a binary kernel: casts to `compute`, broadcasts, allocates. No autograd.
Tensor binary_raw(BinaryOp op, const Tensor& a, const Tensor& b, DType compute, DType out_dtype) {
  const char* name = kernels::binary_op_name(op);
  detail::check_same_device(name, a, b);
  Dims shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor x = raw::expand(detail::cast_raw(a, compute), shape);
  Tensor y = raw::expand(detail::cast_raw(b, compute), shape);
  Tensor out = raw::empty(shape, out_dtype, a.device());
  kernels::binary(a.device(), op, x, y, out);
  return out;
}

struct BinaryArithOp {
  static constexpr const char* kName = "binary";
  BinaryOp op;
  const char* name() const { return kernels::binary_op_name(op); }
  Dims a_shape, b_shape;
  SavedTensor a, b, out;
  int a_chunks = 0, b_chunks = 0;  // of the backward's sum_to (0: V); set by the bitwise rule
  // add/sub: the 16-bit kernel rounds a float sum once, and the backward only
  // sums (sum_to) gradients. mul/div's backward rounds a product before
  // sum_to sums it, which float32 would not.
  bool exact_widened() const { return op == BinaryOp::Add || op == BinaryOp::Sub; }

  Tensor forward(const Tensor& x, const Tensor& y) {
    DType t = arithmetic_dtype(op, x.dtype(), y.dtype());
    Tensor r = binary_raw(op, x, y, t, t);
    a_shape = x.shape();
    b_shape = y.shape();
    if (op != BinaryOp::Add && op != BinaryOp::Sub) {
      a = x;
      b = y;
    }
    if (op == BinaryOp::Div || op == BinaryOp::Pow) out = r;
    return r;
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    Tensor ga, gb;
    switch (op) {
      case BinaryOp::Add:
        if (ctx.needs(0)) ga = g;
        if (ctx.needs(1)) gb = g;
        break;
      case BinaryOp::Sub:
        if (ctx.needs(0)) ga = g;
        if (ctx.needs(1)) gb = neg(g);
        break;
      case BinaryOp::Mul:
        if (ctx.needs(0)) ga = mul(g, b.get());
        if (ctx.needs(1)) gb = mul(g, a.get());
        break;
      case BinaryOp::Div:
        if (ctx.needs(0)) ga = div(g, b.get());
        if (ctx.needs(1)) gb = neg(div(mul(g, out.get()), b.get()));
        break;
      case BinaryOp::Maximum:
      case BinaryOp::Minimum: {
        const Tensor& x = a.get();
        const Tensor& y = b.get();
        Tensor x_wins = op == BinaryOp::Maximum ? gt(x, y) : lt(x, y);
        Tensor y_wins = op == BinaryOp::Maximum ? lt(x, y) : gt(x, y);
        Tensor half = mul(g, 0.5);
        Tensor tie = eq(x, y);
        if (ctx.needs(0)) ga = where(x_wins, g, where(tie, half, 0.0));
        if (ctx.needs(1)) gb = where(y_wins, g, where(tie, half, 0.0));
        break;
      }
      case BinaryOp::Pow: {
        const Tensor& x = a.get();
        const Tensor& y = b.get();
        if (ctx.needs(0)) ga = mul(mul(g, y), pow(x, sub(y, 1.0)));
        if (ctx.needs(1)) gb = mul(mul(g, out.get()), where(gt(x, 0.0), log(x), 0.0));
        break;
      }
      default: TESSEL_FAIL(kernels::binary_op_name(op), "is not differentiable");
    }
    if (ga.defined()) ga = sum_to(ga, a_shape, a_chunks);
    if (gb.defined()) gb = sum_to(gb, b_shape, b_chunks);
    return {ga, gb};
  }

  // Pointwise; Partial(sum) survives where the op is linear in it (not in
  // bitwise mode: the arithmetic does not commute with the pending sum).
  ShardingPlan sharding(const ShardingContext& ctx) {
    ShardingPlan plan;
    switch (op) {
      case BinaryOp::Add:
      case BinaryOp::Sub: plan = dtensor::pointwise_exact(ctx, {0b11}, false); break;
      case BinaryOp::Mul: plan = dtensor::pointwise_exact(ctx, {0b01, 0b10}, false); break;
      case BinaryOp::Div: plan = dtensor::pointwise_exact(ctx, {0b01}, false); break;
      default: plan = dtensor::pointwise(ctx);
    }
    if (numerics::bitwise()) {
      std::vector<int> ch = dtensor::pointwise_backward_chunks(ctx, plan);
      a_chunks = ch[0];
      b_chunks = ch[1];
    }
    return plan;
  }
};

Tensor arith(BinaryOp op, const Tensor& a, const Tensor& b) { return call(BinaryArithOp{op}, a, b); }

// The scalar as a 0-dim tensor of the dtype `a op scalar` computes in.
Tensor scalar_operand(const Tensor& a, Scalar s) { return detail::scalar_raw(s, s.result_dtype(a.dtype()), a.device()); }

// Comparisons and logical ops: bool results, no gradient. Plain tensors run
// the kernel directly; distributed ones go through call() for the sharding rule.
struct BoolBinaryOp {
  static constexpr const char* kName = "compare";
  BinaryOp op;
  bool logical;
  const char* name() const { return kernels::binary_op_name(op); }
  Tensor forward(const Tensor& x, const Tensor& y) {
    return binary_raw(op, x, y, logical ? DType::Bool : promote_types(x.dtype(), y.dtype()), DType::Bool);
  }
  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>&) { return {Tensor(), Tensor()}; }
  ShardingPlan sharding(const ShardingContext& ctx) { return dtensor::pointwise(ctx); }
};

Tensor compare(BinaryOp op, const Tensor& a, const Tensor& b) {
  if (a.is_distributed() || b.is_distributed()) return call(BoolBinaryOp{op, false}, a, b);
  return binary_raw(op, a, b, promote_types(a.dtype(), b.dtype()), DType::Bool);
}

Tensor logical(BinaryOp op, const Tensor& a, const Tensor& b) {
  if (a.is_distributed() || b.is_distributed()) return call(BoolBinaryOp{op, true}, a, b);
  return binary_raw(op, a, b, DType::Bool, DType::Bool);
}

struct WhereOp {
  static constexpr const char* kName = "where";
  SavedTensor cond;
  Dims a_shape, b_shape;
  int a_chunks = 0, b_chunks = 0;

  Tensor forward(const Tensor& c, const Tensor& a, const Tensor& b) {
    TESSEL_CHECK(c.dtype() == DType::Bool, "where", "condition must be bool, got {}", c.desc());
    detail::check_same_device("where", c, a);
    detail::check_same_device("where", a, b);
    DType t = promote_types(a.dtype(), b.dtype());
    Dims shape = broadcast_shapes(broadcast_shapes(c.shape(), a.shape(), "where"), b.shape(), "where");
    Tensor out = raw::empty(shape, t, a.device());
    kernels::where(a.device(), raw::expand(c, shape), raw::expand(detail::cast_raw(a, t), shape),
                   raw::expand(detail::cast_raw(b, t), shape), out);
    cond = c;
    a_shape = a.shape();
    b_shape = b.shape();
    return out;
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    Tensor zero = detail::scalar_raw(0, g.dtype(), g.device());
    Tensor ga, gb;
    if (ctx.needs(1)) ga = sum_to(where(cond.get(), g, zero), a_shape, a_chunks);
    if (ctx.needs(2)) gb = sum_to(where(cond.get(), zero, g), b_shape, b_chunks);
    return {Tensor(), ga, gb};
  }

  // Linear in (a, b) together, and a pure selection: both Partial(sum) stay Partial.
  ShardingPlan sharding(const ShardingContext& ctx) {
    ShardingPlan plan = dtensor::pointwise_exact(ctx, {0b110}, true);
    if (numerics::bitwise()) {
      std::vector<int> ch = dtensor::pointwise_backward_chunks(ctx, plan);
      a_chunks = ch[1];
      b_chunks = ch[2];
    }
    return plan;
  }
};

}  // namespace

Tensor add(const Tensor& a, const Tensor& b) { return arith(BinaryOp::Add, a, b); }
Tensor sub(const Tensor& a, const Tensor& b) { return arith(BinaryOp::Sub, a, b); }
Tensor mul(const Tensor& a, const Tensor& b) { return arith(BinaryOp::Mul, a, b); }
Tensor div(const Tensor& a, const Tensor& b) { return arith(BinaryOp::Div, a, b); }
Tensor maximum(const Tensor& a, const Tensor& b) { return arith(BinaryOp::Maximum, a, b); }
Tensor minimum(const Tensor& a, const Tensor& b) { return arith(BinaryOp::Minimum, a, b); }
Tensor pow(const Tensor& a, const Tensor& b) { return arith(BinaryOp::Pow, a, b); }
Tensor add(const Tensor& a, Scalar b) { return add(a, scalar_operand(a, b)); }
Tensor sub(const Tensor& a, Scalar b) { return sub(a, scalar_operand(a, b)); }
Tensor mul(const Tensor& a, Scalar b) { return mul(a, scalar_operand(a, b)); }
Tensor div(const Tensor& a, Scalar b) {
  Tensor s = detail::scalar_raw(b, is_floating(a.dtype()) ? a.dtype() : DType::Float32, a.device());
  return div(a, s);
}
Tensor rsub(const Tensor& a, Scalar b) { return sub(scalar_operand(a, b), a); }
Tensor add(const Tensor& a, const Tensor& b, Scalar alpha) {
  if (!alpha.is_floating() && alpha.to_int() == 1) return add(a, b);
  return add(a, mul(b, alpha));
}

Tensor pow(const Tensor& a, Scalar e) {
  double v = e.to_double();
  if (v == 1.0) return mul(a, 1);
  if (v == 2.0) return square(a);
  if (v == 0.5) return sqrt(a);
  if (v == -1.0) return reciprocal(a);
  Tensor s = detail::scalar_raw(e, is_floating(a.dtype()) ? a.dtype() : DType::Float32, a.device());
  return pow(a, s);
}

Tensor eq(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Eq, a, b); }
Tensor ne(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Ne, a, b); }
Tensor lt(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Lt, a, b); }
Tensor le(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Le, a, b); }
Tensor gt(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Gt, a, b); }
Tensor ge(const Tensor& a, const Tensor& b) { return compare(BinaryOp::Ge, a, b); }
Tensor eq(const Tensor& a, Scalar b) { return eq(a, scalar_operand(a, b)); }
Tensor ne(const Tensor& a, Scalar b) { return ne(a, scalar_operand(a, b)); }
Tensor lt(const Tensor& a, Scalar b) { return lt(a, scalar_operand(a, b)); }
Tensor le(const Tensor& a, Scalar b) { return le(a, scalar_operand(a, b)); }
Tensor gt(const Tensor& a, Scalar b) { return gt(a, scalar_operand(a, b)); }
Tensor ge(const Tensor& a, Scalar b) { return ge(a, scalar_operand(a, b)); }
Tensor logical_and(const Tensor& a, const Tensor& b) { return logical(BinaryOp::LogicalAnd, a, b); }
Tensor logical_or(const Tensor& a, const Tensor& b) { return logical(BinaryOp::LogicalOr, a, b); }
Tensor logical_xor(const Tensor& a, const Tensor& b) { return logical(BinaryOp::LogicalXor, a, b); }

Tensor where(const Tensor& cond, const Tensor& a, const Tensor& b) { return call(WhereOp{}, cond, a, b); }
Tensor where(const Tensor& cond, const Tensor& a, Scalar b) { return where(cond, a, scalar_operand(a, b)); }

Tensor masked_fill(const Tensor& x, const Tensor& mask, Scalar value) {
  TESSEL_CHECK(mask.dtype() == DType::Bool, "masked_fill", "mask must be bool, got {}", mask.desc());
  Dims shape = broadcast_shapes(x.shape(), mask.shape(), "masked_fill");
  TESSEL_CHECK(shape == x.shape(), "masked_fill", "mask {} must broadcast to the input's shape {}", mask.desc(),
               x.shape());
  return where(mask, detail::scalar_raw(value, x.dtype(), x.device()), x);
}

Tensor sum_to(const Tensor& grad, const Dims& shape, int chunks) {
  if (grad.shape() == shape) return grad;
  const int lead = grad.dim() - shape.size();
  TESSEL_CHECK(lead >= 0, "sum_to", "cannot reduce {} to shape {}", grad.desc(), shape);
  std::vector<int64_t> dims;
  for (int d = 0; d < grad.dim(); ++d) {
    if (d < lead) {
      dims.push_back(d);
    } else if (shape[d - lead] == 1 && grad.shape()[d] != 1) {
      dims.push_back(d);
    } else {
      TESSEL_CHECK(shape[d - lead] == grad.shape()[d], "sum_to", "cannot reduce {} to shape {}", grad.desc(), shape);
    }
  }
  Tensor r = dims.empty() ? grad : sum_chunks(grad, dims, /*keepdim=*/true, chunks);
  return r.reshape(shape);
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator-(const Tensor& a, const Tensor& b) { return sub(a, b); }
Tensor operator*(const Tensor& a, const Tensor& b) { return mul(a, b); }
Tensor operator/(const Tensor& a, const Tensor& b) { return div(a, b); }
Tensor operator+(const Tensor& a, Scalar b) { return add(a, b); }
Tensor operator-(const Tensor& a, Scalar b) { return sub(a, b); }
Tensor operator*(const Tensor& a, Scalar b) { return mul(a, b); }
Tensor operator/(const Tensor& a, Scalar b) { return div(a, b); }
Tensor operator+(Scalar a, const Tensor& b) { return add(b, a); }
Tensor operator-(Scalar a, const Tensor& b) { return rsub(b, a); }
Tensor operator*(Scalar a, const Tensor& b) { return mul(b, a); }
Tensor operator-(const Tensor& a) { return neg(a); }

}  // namespace tessel
