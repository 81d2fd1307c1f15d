// Registers the CUDA LayerNorm / RMSNorm kernels (norm.cu).
#include "kernels/cuda/call.h"
#include "kernels/cuda/norm_launch.h"
#include "kernels/norm.h"

namespace tessel::kernels::cuda {
namespace {

void check_norm_args(const char* op, const Tensor& x, const Tensor& w, const Tensor& b) {
  TESSEL_CHECK(x.dim() == 2 && x.is_contiguous(), op, "kernel expects a contiguous [M, N] input, got {}", x.desc());
  for (const Tensor* t : {&w, &b})
    TESSEL_CHECK(!t->defined() || (t->dim() == 1 && t->shape()[0] == x.shape()[1] && t->dtype() == x.dtype() &&
                                   t->is_contiguous()),
                 op, "kernel expects a contiguous [{}] {} parameter, got {}", x.shape()[1], dtype_name(x.dtype()),
                 t->desc());
}

void check_stats(const char* op, const Tensor& x, const Tensor& t) {
  if (!t.defined()) return;
  TESSEL_CHECK(t.is_contiguous() && t.numel() == x.shape()[0] && t.dtype() == accumulate_dtype(x.dtype()), op,
               "statistics {} must be contiguous [{}] {}", t.desc(), x.shape()[0],
               dtype_name(accumulate_dtype(x.dtype())));
}

void* ptr(const Tensor& t) { return t.defined() ? t.raw_data() : nullptr; }

NormArgs args(const Tensor& x, int v, bool rms) {
  NormArgs a;
  a.m = x.shape()[0];
  a.n = x.shape()[1];
  a.rms = rms;
  a.chunks = v;
  a.x = x.raw_data();
  return a;
}

void layer_norm_forward_cuda(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                             const Tensor& mean, const Tensor& rstd, int v) {
  CudaCall call("layer_norm", {&x, &w, &b, &y, &mean, &rstd});
  check_norm_args("layer_norm", x, w, b);
  check_stats("layer_norm", x, mean);
  check_stats("layer_norm", x, rstd);
  if (x.numel() == 0) return;
  NormArgs a = args(x, v, false);
  a.eps = eps;
  a.weight = ptr(w);
  a.bias = ptr(b);
  a.y = y.raw_data();
  a.mean = mean.raw_data();
  a.rstd = rstd.raw_data();
  launch_norm_forward(x.dtype(), a, call.stream());
}

void norm_backward(const char* op, bool rms, const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& mean,
                   const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db, int v) {
  CudaCall call(op, {&g, &x, &w, &mean, &rstd, &dx, &dw, &db});
  check_norm_args(op, x, w, Tensor());
  check_stats(op, x, mean);
  check_stats(op, x, rstd);
  if (x.shape()[1] == 0) return;
  NormArgs a = args(x, v, rms);
  a.g = g.raw_data();
  a.weight = ptr(w);
  a.mean = ptr(mean);
  a.rstd = ptr(rstd);
  a.dx = ptr(dx);
  a.dweight = ptr(dw);
  a.dbias = ptr(db);
  Tensor work;
  if (dw.defined() || db.defined()) {
    work = scratch(call, Dims{int64_t(norm_workspace_bytes(x.dtype(), a.n, v))}, DType::Bool);
    a.work = work.raw_data();
  }
  launch_norm_backward(x.dtype(), a, call.stream());
}

void layer_norm_backward_cuda(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& mean,
                              const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db, int v) {
  norm_backward("layer_norm_backward", false, g, x, w, mean, rstd, dx, dw, db, v);
}

void rms_norm_forward_cuda(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd, int v) {
  CudaCall call("rms_norm", {&x, &w, &y, &rstd});
  check_norm_args("rms_norm", x, w, Tensor());
  check_stats("rms_norm", x, rstd);
  if (x.numel() == 0) return;
  NormArgs a = args(x, v, true);
  a.eps = eps;
  a.weight = ptr(w);
  a.y = y.raw_data();
  a.rstd = rstd.raw_data();
  launch_norm_forward(x.dtype(), a, call.stream());
}

void rms_norm_backward_cuda(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                            const Tensor& dw, int v) {
  norm_backward("rms_norm_backward", true, g, x, w, Tensor(), rstd, dx, dw, Tensor(), v);
}

}  // namespace

TESSEL_REGISTER_KERNEL(layer_norm_forward, DeviceType::CUDA, layer_norm_forward_cuda);
TESSEL_REGISTER_KERNEL(layer_norm_backward, DeviceType::CUDA, layer_norm_backward_cuda);
TESSEL_REGISTER_KERNEL(rms_norm_forward, DeviceType::CUDA, rms_norm_forward_cuda);
TESSEL_REGISTER_KERNEL(rms_norm_backward, DeviceType::CUDA, rms_norm_backward_cuda);

}  // namespace tessel::kernels::cuda
