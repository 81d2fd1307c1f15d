#include "autograd/ops/loss.h"

#include "autograd/function.h"
#include "autograd/grad_mode.h"
#include "autograd/ops/common.h"
#include "autograd/ops/elementwise.h"
#include "autograd/ops/indexing.h"
#include "autograd/ops/reduce.h"
#include "autograd/ops/unary.h"
#include "dtensor/sharding.h"
#include "kernels/loss.h"
#include "runtime/numerics.h"

namespace tessel {

using kernels::LossReduction;

namespace {

LossReduction parse_reduction(const char* op, const std::string& r) {
  if (r == "mean") return LossReduction::Mean;
  if (r == "sum") return LossReduction::Sum;
  if (r == "none") return LossReduction::None;
  TESSEL_FAIL(op, "reduction must be \"mean\", \"sum\" or \"none\", got \"{}\"", r);
}

// Checks scores [..., K] against targets [...]; returns the leading shape.
Dims check_loss_args(const char* op, const Tensor& scores, const Tensor& targets) {
  detail::check_floating(op, scores);
  TESSEL_CHECK(scores.dim() >= 1, op, "scores must have a class dimension (last), got {}", scores.desc());
  TESSEL_CHECK(targets.dtype() == DType::Int64, op, "targets must be int64 class indices, got {}", targets.desc());
  detail::check_same_device(op, scores, targets);
  Dims lead = scores.shape();
  lead.pop_back();
  TESSEL_CHECK(targets.shape() == lead, op, "targets {} must have the shape of the scores {} without the class dim ({})",
               targets.desc(), scores.desc(), lead);
  return lead;
}

// Shared by cross_entropy and nll_loss: per-token losses from a kernel, then
// the reduction over tokens; backward from the saved state.
struct ClassLossOp {
  static constexpr const char* kName = "cross_entropy";
  bool fused_softmax;  // cross_entropy (true) or nll_loss (false)
  int64_t ignore_index;
  LossReduction reduction;
  double label_smoothing;
  int chunks;
  // Reduction "none": per-token losses in the accumulation dtype (float32 for
  // 16-bit scores) instead of the scores' dtype, for class_loss_bitwise.
  bool accumulate_out = false;
  Dims scores_shape, lead;
  int64_t m = 0, k = 0;
  DType scores_dtype = DType::Float32;
  SavedTensor x2, t2, row_max, sum_exp, count;
  const char* name() const { return fused_softmax ? "cross_entropy" : "nll_loss"; }

  Tensor forward(const Tensor& scores, const Tensor& targets) {
    scores_shape = scores.shape();
    scores_dtype = scores.dtype();
    lead = scores.shape();
    lead.pop_back();
    k = scores.shape().back();
    m = numel_of(lead);
    Tensor xf = raw::try_view(detail::contiguous_raw(scores), {m, k});
    Tensor tf = raw::try_view(detail::contiguous_raw(targets), {m});
    kernels::check_targets(scores.device(), tf, k, ignore_index, name());
    const DType acc = accumulate_dtype(scores.dtype());
    Tensor losses = raw::empty({m}, acc, scores.device());
    Tensor cnt = raw::empty(Dims{}, DType::Int64, scores.device());
    if (fused_softmax) {
      Tensor mx = raw::empty({m}, acc, scores.device()), se = raw::empty({m}, acc, scores.device());
      kernels::cross_entropy_forward(scores.device(), xf, tf, ignore_index, label_smoothing, losses, mx, se, cnt,
                                     chunks);
      row_max = mx;
      sum_exp = se;
      x2 = xf;
    } else {
      kernels::nll_loss_forward(scores.device(), xf, tf, ignore_index, losses, cnt);
    }
    t2 = tf;
    count = cnt;
    Tensor out;
    if (reduction == LossReduction::None) {
      out = raw::try_view(accumulate_out ? losses : detail::cast_raw(losses, scores.dtype()), lead);
    } else {
      out = raw::empty(Dims{}, scores.dtype(), scores.device());
      kernels::loss_reduce(scores.device(), losses, cnt, reduction == LossReduction::Mean, out, chunks);
    }
    return out;
  }

  std::vector<Tensor> backward(const GradContext& ctx, std::vector<Tensor>& grads) {
    if (!ctx.needs(0)) return {Tensor(), Tensor()};
    const Tensor& tf = t2.get();
    const Device dev = tf.device();
    Tensor g = detail::contiguous_raw(detail::cast_raw(grads[0], accumulate_dtype(grads[0].dtype())));
    if (reduction == LossReduction::None) g = raw::try_view(g, {m});
    Tensor dx;
    if (fused_softmax) {
      const Tensor& xf = x2.get();
      dx = raw::empty({m, k}, xf.dtype(), dev);
      kernels::cross_entropy_backward(dev, g, xf, tf, row_max.get(), sum_exp.get(), count.get(), ignore_index,
                                      label_smoothing, reduction, dx);
    } else {
      dx = raw::empty({m, k}, scores_dtype, dev);
      kernels::nll_loss_backward(dev, g, tf, count.get(), ignore_index, reduction, dx);
    }
    return {raw::try_view(dx, scores_shape), Tensor()};
  }

  // Per-token losses (reduction "none"): rows may be sharded (scores and
  // targets alike), the class dim is whole. A reduced loss is computed
  // replicated (class_loss_distributed decomposes it instead).
  ShardingPlan sharding(const ShardingContext& ctx) {
    if (reduction != LossReduction::None) return dtensor::replicate(ctx);
    const TensorSpec& s = ctx.in[0];
    Placements p = dtensor::unshard(s.placements, {s.dim() - 1}, true);
    return {{p, p}, {p}};
  }
};

// Bitwise mode: the fused kernel's arithmetic on a mesh. Per-token losses
// are row-local (class dim gathered if sharded); "sum" is the canonical sum
// over tokens (each piece its subtree of chunks, finished by the all-reduce,
// or gathered), "mean" that sum divided by the global count — the bits of
// loss_reduce on one device, and the same backward (scale g / count). For
// 16-bit scores all of it stays in float32, as in loss_reduce, and only the
// result is rounded to the scores' dtype (rounding each token's loss first
// would give other bits).
Tensor class_loss_bitwise(const Tensor& scores, const Tensor& targets, int64_t ignore_index, LossReduction red,
                          double label_smoothing, bool fused) {
  ClassLossOp op{fused, ignore_index, LossReduction::None, label_smoothing, numerics::reduction_chunks()};
  op.accumulate_out = true;
  Tensor losses = call(op, scores, targets);
  Tensor out;
  if (red == LossReduction::None) {
    out = losses;
  } else {
    Tensor total = sum(losses);
    out = red == LossReduction::Sum ? total : total / sum(ne(targets, Scalar(ignore_index)).to(losses.dtype()));
  }
  return out.to(scores.dtype());
}

// The losses of distributed scores, from ops that know how to shard: with
// the class dim sharded (vocabulary parallel) the target logit is a masked
// gather and the log-sum-exp a pending max and a pending sum; with tokens
// sharded, the mean divides the pending sum of losses by the global count.
Tensor class_loss_distributed(const Tensor& scores, const Tensor& targets, int64_t ignore_index, LossReduction red,
                              double label_smoothing, bool fused) {
  if (numerics::bitwise()) return class_loss_bitwise(scores, targets, ignore_index, red, label_smoothing, fused);
  const int last = scores.dim() - 1;
  const int64_t K = scores.shape()[last];
  Tensor valid = ne(targets, Scalar(ignore_index));
  Tensor safe = where(valid, targets, Scalar(int64_t(0)));
  Tensor picked = gather(scores, last, safe.unsqueeze(-1)).squeeze(-1);
  Tensor loss;
  if (fused) {
    Tensor m;
    {
      NoGradGuard ng;
      m = amax(scores.detach(), {last}, /*keepdim=*/true);
    }
    Tensor lse = log(sum(exp(scores - m), {last})) + m.squeeze(-1);
    loss = label_smoothing > 0 ? lse - picked * (1.0 - label_smoothing) - sum(scores, {last}) * (label_smoothing / double(K))
                               : lse - picked;
  } else {
    loss = -picked;
  }
  loss = where(valid, loss, Scalar(0.0));
  if (red == LossReduction::None) return loss;
  Tensor total = sum(loss);
  if (red == LossReduction::Sum) return total;
  return total / sum(valid.to(scores.dtype()));
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index, const std::string& reduction,
                     double label_smoothing) {
  const char* op = "cross_entropy";
  check_loss_args(op, logits, targets);
  LossReduction red = parse_reduction(op, reduction);
  TESSEL_CHECK(label_smoothing >= 0.0 && label_smoothing <= 1.0, op, "label_smoothing must be in [0, 1], got {}",
               label_smoothing);
  if (logits.is_distributed() || targets.is_distributed())
    return class_loss_distributed(logits, targets, ignore_index, red, label_smoothing, true);
  return call(ClassLossOp{true, ignore_index, red, label_smoothing, numerics::reduction_chunks()}, logits, targets);
}

Tensor nll_loss(const Tensor& log_probs, const Tensor& targets, int64_t ignore_index, const std::string& reduction) {
  const char* op = "nll_loss";
  check_loss_args(op, log_probs, targets);
  LossReduction red = parse_reduction(op, reduction);
  if (log_probs.is_distributed() || targets.is_distributed())
    return class_loss_distributed(log_probs, targets, ignore_index, red, 0.0, false);
  return call(ClassLossOp{false, ignore_index, red, 0.0, numerics::reduction_chunks()}, log_probs, targets);
}

}  // namespace tessel
