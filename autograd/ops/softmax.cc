#include "autograd/ops/softmax.h"

#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "dtensor/sharding.h"
#include "kernels/softmax.h"
#include "runtime/numerics.h"

namespace tessel {
namespace {

struct SoftmaxOp {
  static constexpr const char* kName = "softmax";
  int dim;
  bool log;
  int chunks;  // V at forward time; backward uses the same
  SavedTensor y;
  const char* name() const { return log ? "log_softmax" : "softmax"; }

  Tensor forward(const Tensor& x) {
    Tensor out = raw::empty(x.shape(), x.dtype(), x.device());
    kernels::softmax_forward(x.device(), x, dim, log, out, chunks);
    y = out;
    return out;
  }

  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) {
    const Tensor& ys = y.get();
    Tensor g = detail::cast_raw(grads[0], ys.dtype());
    Tensor dx = raw::empty(ys.shape(), ys.dtype(), ys.device());
    kernels::softmax_backward(ys.device(), g, ys, dim, log, dx, chunks);
    return {dx};
  }

  // Rows stay where they are; the softmax dim itself is never sharded here
  // (softmax_impl decomposes that case).
  ShardingPlan sharding(const ShardingContext& ctx) {
    Placements p = dtensor::unshard(ctx.in[0].placements, {dim}, true);
    return {{p}, {p}};
  }
};

bool sharded_along(const Tensor& x, int d) {
  if (!x.is_distributed()) return false;
  for (const Placement& p : x.placements())
    if (p.is_shard(d)) return true;
  return false;
}

// Softmax over a sharded dim from ops that know how to shard: the stabilising
// max is a pending max (no gradient flows through it), the denominator a
// pending sum.
Tensor softmax_sharded(const Tensor& x, int d, bool log_out) {
  Tensor m;
  {
    NoGradGuard ng;
    m = amax(x.detach(), {d}, /*keepdim=*/true);
  }
  Tensor z = x - m;
  Tensor e = exp(z);
  Tensor s = sum(e, {d}, /*keepdim=*/true);
  return log_out ? z - log(s) : e / s;
}

Tensor softmax_impl(const Tensor& x, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  detail::check_floating(op, x);
  if (x.dim() == 0) {  // a scalar is a row of one element
    wrap_dim(dim, 1, op);
    return softmax_impl(x.reshape({1}), 0, log).reshape({});
  }
  int d = wrap_dim(dim, x.dim(), op);
  // (Bitwise mode gathers the dim instead: the decomposition has other bits.)
  if (sharded_along(x, d) && !numerics::bitwise()) return softmax_sharded(x, d, log);
  return call(SoftmaxOp{d, log, numerics::reduction_chunks()}, x);
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true); }

}  // namespace tessel
