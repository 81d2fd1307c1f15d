// Registers the CUDA loss kernels (loss.cu).
#include <cstdint>
#include <limits>

#include "kernels/cuda/call.h"
#include "kernels/cuda/loss_launch.h"
#include "kernels/loss.h"

namespace tessel::kernels::cuda {
namespace {

void check_targets_cuda(const Tensor& targets, int64_t k, int64_t ignore_index, const char* op) {
  CudaCall call(op, {&targets});
  TESSEL_CHECK(targets.dtype() == DType::Int64 && targets.is_contiguous(), op,
               "targets must be a contiguous int64 tensor, got {}", targets.desc());
  const int64_t m = targets.numel();
  if (m == 0) return;
  const int64_t none = std::numeric_limits<int64_t>::max();
  Tensor bad = upload(call, &none, Dims{}, DType::Int64);
  launch_find_bad_target(static_cast<const int64_t*>(targets.raw_data()), m, k, ignore_index,
                         static_cast<int64_t*>(bad.raw_data()), call.stream());
  int64_t pos = none;
  read_back(call, bad, &pos, sizeof(pos));  // synchronises: the error is raised here, like the CPU's
  if (pos == none) return;
  int64_t value = 0;
  read_back(call, raw::narrow(targets, 0, pos, 1), &value, sizeof(value));
  TESSEL_FAIL(op, "target {} at position {} is out of range: class indices must be in [0, {}) or equal ignore_index ({})",
              value, pos, k, ignore_index);
}

void check_layout(const char* op, const Tensor& x, const Tensor& targets) {
  TESSEL_CHECK(x.dim() == 2 && x.is_contiguous() && targets.dim() == 1 && targets.shape()[0] == x.shape()[0] &&
                   targets.is_contiguous() && targets.dtype() == DType::Int64,
               op, "kernel expects contiguous [M, K] scores and int64 [M] targets, got {} and {}", x.desc(),
               targets.desc());
}

LossArgs args(const Tensor& x, const Tensor& targets, int64_t ignore_index) {
  LossArgs a;
  a.m = x.shape()[0];
  a.k = x.shape()[1];
  a.ignore_index = ignore_index;
  a.scores = x.raw_data();
  a.targets = static_cast<const int64_t*>(targets.raw_data());
  return a;
}

void ce_forward_cuda(const Tensor& logits, const Tensor& targets, int64_t ignore, double eps, const Tensor& losses,
                     const Tensor& row_max, const Tensor& sum_exp, const Tensor& count, int v) {
  CudaCall call("cross_entropy", {&logits, &targets, &losses, &row_max, &sum_exp, &count});
  check_layout("cross_entropy", logits, targets);
  LossArgs a = args(logits, targets, ignore);
  a.label_smoothing = eps;
  a.chunks = v;
  a.losses = losses.raw_data();
  a.row_max = row_max.raw_data();
  a.sum_exp = sum_exp.raw_data();
  a.count = static_cast<int64_t*>(count.raw_data());
  launch_cross_entropy_forward(logits.dtype(), a, call.stream());
}

void ce_backward_cuda(const Tensor& g, const Tensor& logits, const Tensor& targets, const Tensor& row_max,
                      const Tensor& sum_exp, const Tensor& count, int64_t ignore, double eps, LossReduction red,
                      const Tensor& dlogits) {
  CudaCall call("cross_entropy_backward", {&g, &logits, &targets, &row_max, &sum_exp, &count, &dlogits});
  check_layout("cross_entropy_backward", logits, targets);
  TESSEL_CHECK(g.is_contiguous() && dlogits.is_contiguous(), "cross_entropy_backward",
               "gradient {} and result {} must be contiguous", g.desc(), dlogits.desc());
  LossArgs a = args(logits, targets, ignore);
  a.label_smoothing = eps;
  a.reduction = red;
  a.g = g.raw_data();
  a.row_max = row_max.raw_data();
  a.sum_exp = sum_exp.raw_data();
  a.count = static_cast<int64_t*>(count.raw_data());
  a.dscores = dlogits.raw_data();
  launch_cross_entropy_backward(logits.dtype(), a, call.stream());
}

void nll_forward_cuda(const Tensor& logp, const Tensor& targets, int64_t ignore, const Tensor& losses,
                      const Tensor& count) {
  CudaCall call("nll_loss", {&logp, &targets, &losses, &count});
  check_layout("nll_loss", logp, targets);
  LossArgs a = args(logp, targets, ignore);
  a.losses = losses.raw_data();
  a.count = static_cast<int64_t*>(count.raw_data());
  launch_nll_forward(logp.dtype(), a, call.stream());
}

void nll_backward_cuda(const Tensor& g, const Tensor& targets, const Tensor& count, int64_t ignore, LossReduction red,
                       const Tensor& dlogp) {
  CudaCall call("nll_loss_backward", {&g, &targets, &count, &dlogp});
  check_layout("nll_loss_backward", dlogp, targets);
  LossArgs a;
  a.m = dlogp.shape()[0];
  a.k = dlogp.shape()[1];
  a.ignore_index = ignore;
  a.reduction = red;
  a.targets = static_cast<const int64_t*>(targets.raw_data());
  a.g = g.raw_data();
  a.count = static_cast<int64_t*>(count.raw_data());
  a.dscores = dlogp.raw_data();
  launch_nll_backward(dlogp.dtype(), a, call.stream());
}

void loss_reduce_cuda(const Tensor& losses, const Tensor& count, bool mean, const Tensor& out, int v) {
  CudaCall call("loss_reduce", {&losses, &count, &out});
  TESSEL_CHECK(losses.dim() == 1 && losses.is_contiguous() &&
                   (losses.dtype() == DType::Float32 || losses.dtype() == DType::Float64),
               "loss_reduce", "expects contiguous float32/float64 [M] losses, got {}", losses.desc());
  launch_loss_reduce(losses.dtype(), out.dtype(), losses.raw_data(), losses.numel(),
                     static_cast<const int64_t*>(count.raw_data()), mean, out.raw_data(), v, call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(check_targets, DeviceType::CUDA, check_targets_cuda);
TESSEL_REGISTER_KERNEL(cross_entropy_forward, DeviceType::CUDA, ce_forward_cuda);
TESSEL_REGISTER_KERNEL(cross_entropy_backward, DeviceType::CUDA, ce_backward_cuda);
TESSEL_REGISTER_KERNEL(nll_loss_forward, DeviceType::CUDA, nll_forward_cuda);
TESSEL_REGISTER_KERNEL(nll_loss_backward, DeviceType::CUDA, nll_backward_cuda);
TESSEL_REGISTER_KERNEL(loss_reduce, DeviceType::CUDA, loss_reduce_cuda);

}  // namespace tessel::kernels::cuda
