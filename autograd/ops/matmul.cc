#include "autograd/ops/matmul.h"

#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "dtensor/sharding.h"
#include "kernels/matmul.h"
#include "runtime/cost.h"
#include "runtime/numerics.h"

namespace tessel {
namespace {

// t with `shape` (same elements): a view when the strides allow it, else a copy.
Tensor as_shape(const Tensor& t, const Dims& shape) {
  Tensor v = raw::try_view(t, shape);
  return v.defined() ? v : raw::try_view(detail::contiguous_raw(t), shape);
}

// Product of all but the last `keep` dims.
int64_t leading(const Dims& s, int keep) { return numel_of(Dims(s.data(), size_t(s.size() - keep))); }

Tensor bmm_raw(const Tensor& x, const Tensor& y, int chunks) {
  Tensor out = raw::empty(Dims{x.shape()[0], x.shape()[1], y.shape()[2]}, x.dtype(), x.device());
  cost::add_gemm(x.shape()[0], x.shape()[1], y.shape()[2], x.shape()[2]);
  kernels::bmm(x.device(), x, y, out, /*accumulate=*/false, chunks);
  return out;
}

// a [..., M, K] times b: either [K, N], shared by every row of a (folded into
// one GEMM over all rows, so the weight gradient reduces over all of them), or
// [..., K, N] with a's batch dims. dtype already common.
struct MatmulOp {
  static constexpr const char* kName = "matmul";
  int chunks;              // the forward's reduction over K
  int chunks_n = 0;        // a's gradient, over N (0: chunks)
  int chunks_m = 0;        // b's gradient, over M (all rows for a shared b) (0: chunks)
  // 16-bit GEMMs widen to float32 and round the result once (kernels/cpu/matmul.cc).
  bool exact_widened() const { return true; }
  SavedTensor a3, b3;  // [Bt, M, K] / [Bt, K, N] (shared b: [1, rows, K] / [1, K, N])
  Dims a_shape, b_shape, out3_shape;

  Tensor forward(const Tensor& x, const Tensor& y) {
    const bool shared = y.dim() == 2;
    const int64_t M = x.size(-2), K = x.size(-1), N = y.size(-1);
    a_shape = x.shape();
    b_shape = y.shape();
    Tensor xa = shared ? as_shape(x, Dims{1, leading(x.shape(), 1), K}) : as_shape(x, Dims{leading(x.shape(), 2), M, K});
    Tensor yb = shared ? raw::unsqueeze(y, 0) : as_shape(y, Dims{leading(y.shape(), 2), K, N});
    Tensor out3 = bmm_raw(xa, yb, chunks);
    a3 = xa;
    b3 = yb;
    out3_shape = out3.shape();
    Dims oshape = x.shape();
    oshape[oshape.size() - 1] = N;
    return raw::try_view(out3, oshape);
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    Tensor g = raw::try_view(detail::contiguous_raw(grads[0]), out3_shape);
    Tensor ga, gb;
    const int cn = chunks_n > 0 ? chunks_n : chunks, cm = chunks_m > 0 ? chunks_m : chunks;
    if (ctx.needs(0)) ga = as_shape(bmm_raw(g, raw::transpose(b3.get(), 1, 2), cn), a_shape);
    if (ctx.needs(1)) {
      const Tensor& bt = b3.get();
      if (bt.stride(1) == 1 && bt.stride(2) != 1) {
        // b is a transposed view (linear's weight.t()): compute the gradient in
        // the weight's own layout, (g^T a)^T, so the weight's .grad arrives
        // contiguous and is taken without a copy. Same bits as a^T g: each
        // element is the same canonical sum of the same products (a*b == b*a).
        gb = as_shape(raw::transpose(bmm_raw(raw::transpose(g, 1, 2), a3.get(), cm), 1, 2), b_shape);
      } else {
        gb = as_shape(bmm_raw(raw::transpose(a3.get(), 1, 2), g, cm), b_shape);
      }
    }
    return {ga, gb};
  }

  // Rows of a times columns of b, over a's batch dims: b has them too, or b is
  // 2-D and shared ("..." stands for no dims in b, so b stays Replicate where
  // a batch dim is sharded). dtensor::einsum derives, per mesh dim, the
  // candidates -- shard a batch dim, M, N, K (output Partial), keep a Partial
  // operand (not in bitwise mode), replicate -- and keeps the cheapest. In
  // bitwise mode it drops a shard that would cut a canonical reduction
  // inexactly -- K forward, N for a's gradient, M (all rows, for a shared b:
  // the letters b lacks, row-major as forward() folds them) for b's --
  // and returns the chunk counts each piece then uses.
  ShardingPlan sharding(const ShardingContext& ctx) {
    std::vector<int> c;  // bitwise mode: [0] the forward's, [1] a's gradient's, [2] b's
    ShardingPlan plan = dtensor::einsum(ctx, "...mk,...kn->...mn", &c);
    if (!c.empty()) chunks = c[0], chunks_n = c[1], chunks_m = c[2];
    return plan;
  }
};

// y = x W^T + b for float32/float64 with one dtype: the GEMM starts from the
// bias (C = b broadcast over rows, then C = C + tree), which saves the
// separate add's pass over y and its output buffer. Same bits as matmul +
// add: b + tree == tree + b (IEEE addition commutes). The gradients are those
// of matmul + add, computed with the same products and sums: dx = g W,
// dW = g^T x (the weight's layout), db = sum_to(g, b's shape).
struct LinearBiasOp {
  static constexpr const char* kName = "linear";
  Dims x_shape, out_shape;
  SavedTensor x2, w;  // x as [M, K]; the weight [N, K]

  Tensor forward(const Tensor& x, const Tensor& weight, const Tensor& bias) {
    const int64_t N = weight.shape()[0], K = weight.shape()[1];
    x_shape = x.shape();
    out_shape = Dims(x.shape().data(), size_t(x.dim() - 1));
    out_shape.push_back(N);
    Tensor xm = raw::try_view(x, {-1, K});
    if (!xm.defined()) xm = raw::try_view(detail::contiguous_raw(x), {-1, K});
    const int64_t M = xm.shape()[0];
    Tensor out = raw::empty(Dims{1, M, N}, x.dtype(), x.device());
    kernels::copy(x.device(), raw::expand(raw::unsqueeze(raw::unsqueeze(bias, 0), 0), {1, M, N}), out);
    cost::add_gemm(1, M, N, K);
    kernels::bmm(x.device(), raw::unsqueeze(xm, 0), raw::unsqueeze(raw::transpose(weight, 0, 1), 0), out,
                 /*accumulate=*/true, numerics::reduction_chunks());
    x2 = xm;
    w = weight;
    return raw::try_view(out, out_shape);
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor& g = grads[0];
    const int64_t N = out_shape.back();
    Tensor g3 = g.reshape({1, -1, N});
    Tensor gx, gw, gb;
    if (ctx.needs(0)) gx = bmm(g3, w.get().unsqueeze(0)).reshape(x_shape);
    if (ctx.needs(1)) gw = bmm(g3.transpose(1, 2), x2.get().unsqueeze(0)).squeeze(0);
    if (ctx.needs(2)) gb = sum_to(g, Dims{N});
    return {gx, gw, gb};
  }
};

void check_operands(const char* op, const Tensor& a, const Tensor& b) {
  detail::check_same_device(op, a, b);
  TESSEL_CHECK(is_floating(a.dtype()) && is_floating(b.dtype()), op,
               "needs floating-point operands, got {} and {}", a.desc(), b.desc());
  TESSEL_CHECK(a.dim() >= 1 && b.dim() >= 1, op, "operands must have at least one dimension, got {} and {}",
               a.desc(), b.desc());
}

}  // namespace

Tensor bmm(const Tensor& a, const Tensor& b) {
  check_operands("bmm", a, b);
  TESSEL_CHECK(a.dim() == 3 && b.dim() == 3, "bmm", "expects 3-D operands, got {} and {}", a.desc(), b.desc());
  TESSEL_CHECK(a.shape()[0] == b.shape()[0] && a.shape()[2] == b.shape()[1], "bmm",
               "shapes {} and {} cannot be multiplied (batch {} vs {}, inner {} vs {})", a.shape(), b.shape(),
               a.shape()[0], b.shape()[0], a.shape()[2], b.shape()[1]);
  DType t = promote_types(a.dtype(), b.dtype());
  return call(MatmulOp{numerics::reduction_chunks()}, a.to(t), b.to(t));
}

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  check_operands("matmul", a_in, b_in);
  DType t = promote_types(a_in.dtype(), b_in.dtype());
  Tensor a = a_in.to(t), b = b_in.to(t);
  const bool a1 = a.dim() == 1, b1 = b.dim() == 1;
  if (a1) a = a.unsqueeze(0);
  if (b1) b = b.unsqueeze(1);
  const int64_t M = a.size(-2), K = a.size(-1), K2 = b.size(-2), N = b.size(-1);
  TESSEL_CHECK(K == K2, "matmul", "shapes {} and {} cannot be multiplied ({} vs {} in the contracted dimension)",
               a_in.shape(), b_in.shape(), K, K2);
  Tensor out;
  if (b.dim() == 2) {
    // Every leading dim of a folds into M: one GEMM, weight gradients reduce over all rows.
    out = call(MatmulOp{numerics::reduction_chunks()}, a, b);
  } else {
    Dims ab(a.shape().data(), size_t(a.dim() - 2)), bb(b.shape().data(), size_t(b.dim() - 2));
    Dims batch = broadcast_shapes(ab, bb, "matmul");
    Dims ae = batch, be = batch;
    ae.push_back(M);
    ae.push_back(K);
    be.push_back(K);
    be.push_back(N);
    out = call(MatmulOp{numerics::reduction_chunks()}, a.shape() == ae ? a : a.expand(ae),
               b.shape() == be ? b : b.expand(be));
  }
  if (a1) out = out.squeeze(-2);
  if (b1) out = out.squeeze(-1);
  return out;
}

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  TESSEL_CHECK(weight.dim() == 2, "linear", "weight must be 2-D [out, in], got {}", weight.desc());
  TESSEL_CHECK(x.dim() >= 1 && x.size(-1) == weight.size(1), "linear",
               "input {} does not match weight {} (in_features {})", x.desc(), weight.desc(), weight.size(1));
  if (!bias.defined()) return matmul(x, weight.t());
  TESSEL_CHECK(bias.dim() == 1 && bias.size(0) == weight.size(0), "linear",
               "bias {} does not match weight {} (out_features {})", bias.desc(), weight.desc(), weight.size(0));
  const DType t = x.dtype();
  // (Distributed operands take matmul + add, whose ops have sharding rules.)
  const bool plain = !x.is_distributed() && !weight.is_distributed() && !bias.is_distributed();
  if (plain && (t == DType::Float32 || t == DType::Float64) && weight.dtype() == t && bias.dtype() == t &&
      x.numel() > 0) {
    detail::check_same_device("linear", x, weight);
    detail::check_same_device("linear", x, bias);
    return call(LinearBiasOp{}, x, weight, bias);
  }
  // 16-bit or mixed dtypes: the product is rounded before the add (two roundings), kept as it was.
  return matmul(x, weight.t()) + bias;
}

}  // namespace tessel
