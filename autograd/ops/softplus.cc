// softplus: the op struct holds everything about the op -- its checks (run on
// Meta tensors too, so a distributed call or a Meta model checks before any
// kernel runs), the kernel it dispatches to, its backward and its sharding
// rule.
#include "autograd/ops/softplus.h"

#include <cmath>

#include "autograd/function.h"
#include "autograd/ops/common.h"
#include "dtensor/sharding.h"
#include "kernels/softplus.h"

namespace tessel {
namespace {

struct SoftplusOp {
  static constexpr const char* kName = "softplus";
  double beta, threshold;  // attributes
  SavedTensor x;           // what backward needs (saved with its version)

  Tensor forward(const Tensor& in) {
    detail::check_floating("softplus", in);
    Tensor out = raw::empty(in.shape(), in.dtype(), in.device());
    kernels::softplus_forward(in.device(), in, beta, threshold, out);
    x = in;
    return out;
  }

  // One gradient per tensor input. grads[0] is shaped like the output, on its
  // device, in its dtype (the engine sees to it), so it is the kernel's g.
  std::vector<Tensor> backward(const GradContext&, std::vector<Tensor>& grads) {
    const Tensor& xs = x.get();
    const Tensor& g = grads[0];
    Tensor dx = raw::empty(xs.shape(), xs.dtype(), xs.device());
    kernels::softplus_backward(xs.device(), g, xs, beta, threshold, dx);
    return {dx};
  }

  // Elementwise: any sharding of x passes through; a Partial(sum) input is
  // reduced first (softplus is not linear).
  ShardingPlan sharding(const ShardingContext& ctx) { return dtensor::pointwise(ctx); }
};

}  // namespace

Tensor softplus(const Tensor& x, double beta, double threshold) {
  TESSEL_CHECK(std::isfinite(beta) && beta > 0 && std::isfinite(threshold), "softplus",
               "beta must be positive and finite and threshold finite, got beta {} and threshold {} for {}", beta,
               threshold, x.desc());
  return call(SoftplusOp{beta, threshold}, x);
}

}  // namespace tessel
