#include "autograd/ops/norm.h"

#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "dtensor/sharding.h"
#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "kernels/reduce.h"
#include "runtime/numerics.h"

namespace tessel {
namespace {

// Validates the arguments and returns N (the normalised size).
int64_t check_norm(const char* op, const Tensor& x, const Dims& nshape, const Tensor& w, const Tensor& b,
                   double eps) {
  detail::check_floating(op, x);
  TESSEL_CHECK(!nshape.empty(), op, "normalized_shape must not be empty (input {})", x.desc());
  TESSEL_CHECK(nshape.size() <= x.dim(), op, "normalized_shape {} has more dims than the input {}", nshape, x.desc());
  for (int i = 0; i < nshape.size(); ++i)
    TESSEL_CHECK(x.shape()[x.dim() - nshape.size() + i] == nshape[i], op,
                 "input {} does not end with normalized_shape {}", x.desc(), nshape);
  for (const Tensor* t : {&w, &b}) {
    if (!t->defined()) continue;
    const char* what = t == &w ? "weight" : "bias";
    TESSEL_CHECK(t->shape() == nshape, op, "{} {} must have shape normalized_shape {}", what, t->desc(), nshape);
    TESSEL_CHECK(t->dtype() == x.dtype(), op, "{} {} must have the input's dtype ({})", what, t->desc(),
                 dtype_name(x.dtype()));
    detail::check_same_device(op, x, *t);
  }
  TESSEL_CHECK(eps >= 0, op, "eps must be non-negative, got {}", eps);
  return numel_of(nshape);
}

// Contiguous [rows, n] (or [n]) view of t, copying when t is not contiguous.
Tensor flat(const Tensor& t, const Dims& shape) {
  if (!t.defined()) return t;
  return raw::try_view(detail::contiguous_raw(t), shape);
}

struct NormOp {
  static constexpr const char* kName = "layer_norm";
  bool rms;
  double eps;
  int chunks;
  Dims nshape;
  int row_chunks = 0;  // of the weight/bias gradients' sums over rows (0: chunks); bitwise rule
  int64_t m = 0, n = 0;
  Dims x_shape;
  SavedTensor x2, w2, mean, rstd;
  const char* name() const { return rms ? "rms_norm" : "layer_norm"; }

  Tensor forward(const Tensor& x, const Tensor& w, const Tensor& b) {
    x_shape = x.shape();
    n = numel_of(nshape);
    m = 1;
    for (int d = 0; d < x.dim() - nshape.size(); ++d) m *= x.shape()[d];
    Tensor xf = flat(x, {m, n}), wf = flat(w, {n}), bf = flat(b, {n});
    Tensor y = raw::empty({m, n}, x.dtype(), x.device());
    const DType acc = accumulate_dtype(x.dtype());
    Tensor rs = raw::empty({m}, acc, x.device());
    if (rms) {
      kernels::rms_norm_forward(x.device(), xf, wf, eps, y, rs, chunks);
    } else {
      Tensor mu = raw::empty({m}, acc, x.device());
      kernels::layer_norm_forward(x.device(), xf, wf, bf, eps, y, mu, rs, chunks);
      mean = mu;
    }
    x2 = xf;
    w2 = wf;
    rstd = rs;
    return raw::try_view(y, x_shape);
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    const Tensor& xf = x2.get();
    const Tensor& wf = w2.get();
    Tensor g = flat(detail::cast_raw(grads[0], xf.dtype()), {m, n});
    Tensor dx, dw, db;
    if (ctx.needs(0)) dx = raw::empty({m, n}, xf.dtype(), xf.device());
    if (ctx.needs(1)) dw = raw::empty({n}, xf.dtype(), xf.device());
    if (ctx.needs(2)) db = raw::empty({n}, xf.dtype(), xf.device());
    if (row_chunks > 0 && row_chunks != chunks && (dw.defined() || db.defined())) {
      // Rows are a sharded piece: the kernel gives dx; the sums over rows use
      // the piece's share of the chunks, with the kernel's arithmetic.
      if (rms) kernels::rms_norm_backward(xf.device(), g, xf, wf, rstd.get(), dx, Tensor(), chunks);
      else kernels::layer_norm_backward(xf.device(), g, xf, wf, mean.get(), rstd.get(), dx, Tensor(), Tensor(), chunks);
      row_sums(g, xf, dw, db);
    } else if (rms) {
      kernels::rms_norm_backward(xf.device(), g, xf, wf, rstd.get(), dx, dw, chunks);
    } else {
      kernels::layer_norm_backward(xf.device(), g, xf, wf, mean.get(), rstd.get(), dx, dw, db, chunks);
    }
    return {dx.defined() ? raw::try_view(dx, x_shape) : dx, dw.defined() ? raw::try_view(dw, nshape) : dw,
            db.defined() ? raw::try_view(db, nshape) : db};
  }

  // dweight_j = canonical sum over rows of g * xhat, dbias_j = of g (kernels/norm.h),
  // in the compute dtype C, with row_chunks chunks; rounded once into dw/db.
  void row_sums(const Tensor& g, const Tensor& xf, const Tensor& dw, const Tensor& db) const {
    const Device dev = xf.device();
    const DType acc = accumulate_dtype(xf.dtype());
    Tensor gc = detail::cast_raw(g, acc), xc = detail::cast_raw(xf, acc);
    auto col = [&](const Tensor& t) { return raw::expand(raw::unsqueeze(t, 1), {m, n}); };
    auto bin = [&](kernels::BinaryOp op, const Tensor& a, const Tensor& b) {
      Tensor o = raw::empty({m, n}, acc, dev);
      kernels::binary(dev, op, a, b, o);
      return o;
    };
    auto column_sum = [&](const Tensor& t, const Tensor& dst) {
      Tensor s = raw::empty({1, n}, acc, dev);
      kernels::reduce(dev, kernels::ReduceOp::Sum, t, s, row_chunks);
      if (m == 1) {  // one row: the canonical sum is +0 + x (a -0 becomes +0), which a copy would not do
        kernels::binary(dev, kernels::BinaryOp::Add, s, raw::expand(detail::scalar_raw(0.0, acc, dev), {1, n}), s);
      }
      kernels::copy(dev, raw::try_view(s, {n}), dst);
    };
    if (dw.defined()) {
      Tensor xhat = rms ? bin(kernels::BinaryOp::Mul, xc, col(rstd.get()))
                        : bin(kernels::BinaryOp::Mul, bin(kernels::BinaryOp::Sub, xc, col(mean.get())), col(rstd.get()));
      column_sum(bin(kernels::BinaryOp::Mul, gc, xhat), dw);
    }
    if (db.defined()) column_sum(gc, db);
  }

  // Rows (the leading dims) may be sharded, e.g. sequence parallel; the
  // normalised dims are whole here (layer_norm/rms_norm decompose otherwise).
  // Weight and bias are replicated: their gradients come out Partial.
  ShardingPlan sharding(const ShardingContext& ctx) {
    const TensorSpec& x = ctx.in[0];
    Placements p = dtensor::unshard(x.placements, {}, true);
    for (int d = x.dim() - nshape.size(); d < x.dim(); ++d) p = dtensor::unshard(p, {d}, false);
    if (numerics::bitwise()) {  // the weight/bias gradients sum over rows: exact pieces or gathered rows
      std::vector<int> rows;
      for (int d = 0; d < x.dim() - nshape.size(); ++d) rows.push_back(d);
      row_chunks = dtensor::local_chunks(x.shape, p, *ctx.mesh, rows, chunks);
      if (row_chunks == 0) {
        for (int d : rows) p = dtensor::unshard(p, {d}, false);
        row_chunks = chunks;
      }
    }
    const Placements r = Placements::replicated(ctx.mesh_ndim());
    return {{p, r, r}, {p}};
  }
};

// Is any of the last `k` dims of x sharded?
bool normalized_dims_sharded(const Tensor& x, int k) {
  if (!x.is_distributed()) return false;
  for (const Placement& p : x.placements())
    if (p.is_shard() && p.dim >= x.dim() - k) return true;
  return false;
}

std::vector<int64_t> last_dims(int n, int k) {
  std::vector<int64_t> dims;
  for (int d = n - k; d < n; ++d) dims.push_back(d);
  return dims;
}

// Norms over sharded dims from shardable ops (statistics become pending sums).
Tensor norm_sharded(const Tensor& x, int k, const Tensor& w, const Tensor& b, double eps, bool rms) {
  std::vector<int64_t> dims = last_dims(x.dim(), k);
  Tensor y;
  if (rms) {
    y = x * rsqrt(mean(square(x), dims, /*keepdim=*/true) + eps);
  } else {
    Tensor xc = x - mean(x, dims, /*keepdim=*/true);
    y = xc * rsqrt(mean(square(xc), dims, /*keepdim=*/true) + eps);
  }
  if (w.defined()) y = y * w;
  if (b.defined()) y = y + b;
  return y;
}

}  // namespace

Tensor layer_norm(const Tensor& x, const Dims& normalized_shape, const Tensor& weight, const Tensor& bias,
                  double eps) {
  check_norm("layer_norm", x, normalized_shape, weight, bias, eps);
  if (normalized_dims_sharded(x, normalized_shape.size()) && !numerics::bitwise())
    return norm_sharded(x, normalized_shape.size(), weight, bias, eps, false);
  return call(NormOp{false, eps, numerics::reduction_chunks(), normalized_shape}, x, weight, bias);
}

Tensor rms_norm(const Tensor& x, const Dims& normalized_shape, const Tensor& weight, double eps) {
  check_norm("rms_norm", x, normalized_shape, weight, Tensor(), eps);
  if (normalized_dims_sharded(x, normalized_shape.size()) && !numerics::bitwise())
    return norm_sharded(x, normalized_shape.size(), weight, Tensor(), eps, true);
  return call(NormOp{true, eps, numerics::reduction_chunks(), normalized_shape}, x, weight, Tensor());
}

}  // namespace tessel
