// Registers the CUDA softmax kernels (softmax.cu).
#include "kernels/cuda/call.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/softmax_launch.h"
#include "kernels/softmax.h"

namespace tessel::kernels::cuda {
namespace {

void softmax_forward_cuda(const Tensor& x, int64_t dim, bool log, const Tensor& out, int v) {
  const char* op = log ? "log_softmax" : "softmax";
  CudaCall call(op, {&x, &out});
  const int d = wrap_dim(dim, x.dim(), op);
  TESSEL_CHECK(x.shape() == out.shape() && x.dtype() == out.dtype(), op, "input {} and output {} must match",
               x.desc(), out.desc());
  if (x.numel() == 0) return;
  launch_softmax_forward(x.dtype(), make_row_geometry<2>({&x, &out}, d), x.raw_data(), out.raw_data(), log, v,
                         call.stream());
}

void softmax_backward_cuda(const Tensor& g, const Tensor& y, int64_t dim, bool log, const Tensor& dx, int v) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  CudaCall call(op, {&g, &y, &dx});
  const int d = wrap_dim(dim, y.dim(), op);
  TESSEL_CHECK(g.shape() == y.shape() && dx.shape() == y.shape() && g.dtype() == y.dtype() && dx.dtype() == y.dtype(),
               op, "gradient {}, output {} and input gradient {} must match", g.desc(), y.desc(), dx.desc());
  if (y.numel() == 0) return;
  launch_softmax_backward(y.dtype(), make_row_geometry<3>({&g, &y, &dx}, d), g.raw_data(), y.raw_data(),
                          dx.raw_data(), log, v, call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(softmax_forward, DeviceType::CUDA, softmax_forward_cuda);
TESSEL_REGISTER_KERNEL(softmax_backward, DeviceType::CUDA, softmax_backward_cuda);

}  // namespace tessel::kernels::cuda
