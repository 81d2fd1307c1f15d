// Registers the CUDA unary kernels (unary.cu, unary_backward.cu).
#include "kernels/cuda/call.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/unary_launch.h"
#include "kernels/unary.h"

namespace tessel::kernels::cuda {
namespace {

void unary_cuda(UnaryOp op, const Tensor& x, const Tensor& out) {
  const char* name = unary_op_name(op);
  CudaCall call(name, {&x, &out});
  TESSEL_CHECK(x.shape() == out.shape() && x.dtype() == out.dtype(), name, "input {} and output {} must match",
               x.desc(), out.desc());
  launch_unary(op, x.dtype(), make_elem_geometry<2>({&out, &x}), out.raw_data(), x.raw_data(), call.stream());
}

void unary_backward_cuda(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& dx) {
  const char* name = unary_op_name(op);
  CudaCall call(name, {&g, &x, &y, &dx});
  for (const Tensor* t : {&g, &x, &y})
    TESSEL_CHECK(t->shape() == dx.shape() && t->dtype() == dx.dtype(), name,
                 "backward operands must match the gradient {}, got {}", dx.desc(), t->desc());
  launch_unary_backward(op, dx.dtype(), make_elem_geometry<4>({&dx, &g, &x, &y}), dx.raw_data(), g.raw_data(),
                        x.raw_data(), y.raw_data(), call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(unary, DeviceType::CUDA, unary_cuda);
TESSEL_REGISTER_KERNEL(unary_backward, DeviceType::CUDA, unary_backward_cuda);

}  // namespace tessel::kernels::cuda
