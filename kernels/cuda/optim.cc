// Registers the CUDA optimizer kernels (optim.cu) and the AMP unscale.
#include "kernels/amp.h"
#include "kernels/cuda/call.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/optim_launch.h"
#include "kernels/optim.h"

namespace tessel::kernels::cuda {
namespace {

void check_f32(const char* op, const char* what, const Tensor& t) {
  TESSEL_CHECK(t.dtype() == DType::Float32, op, "{} must be float32, got {}", what, t.desc());
}

void adamw_step_cuda(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const AdamWScalars& s) {
  CudaCall call("adamw_step", {&param, &grad, &m, &v});
  check_f32("adamw_step", "param", param);
  check_f32("adamw_step", "exp_avg", m);
  check_f32("adamw_step", "exp_avg_sq", v);
  TESSEL_CHECK(grad.shape() == param.shape() && m.shape() == param.shape() && v.shape() == param.shape(),
               "adamw_step", "shapes differ: param {}, grad {}, exp_avg {}, exp_avg_sq {}", param.desc(), grad.desc(),
               m.desc(), v.desc());
  launch_adamw(grad.dtype(), make_elem_geometry<4>({&param, &grad, &m, &v}), param.data<float>(), grad.raw_data(),
               m.data<float>(), v.data<float>(), s, call.stream());
}

void sgd_step_cuda(const Tensor& param, const Tensor& grad, const Tensor& buf, const SGDScalars& s) {
  CudaCall call("sgd_step", {&param, &grad, &buf});
  check_f32("sgd_step", "param", param);
  TESSEL_CHECK(grad.shape() == param.shape(), "sgd_step", "shapes differ: param {}, grad {}", param.desc(),
               grad.desc());
  if (s.use_momentum) {
    TESSEL_CHECK(buf.defined(), "sgd_step", "momentum {} needs a momentum buffer", s.momentum);
    check_f32("sgd_step", "momentum_buffer", buf);
    TESSEL_CHECK(buf.shape() == param.shape(), "sgd_step", "shapes differ: param {}, momentum_buffer {}",
                 param.desc(), buf.desc());
  }
  const Tensor& third = s.use_momentum ? buf : param;  // without momentum the third operand is never read
  launch_sgd(grad.dtype(), make_elem_geometry<3>({&param, &grad, &third}), param.data<float>(), grad.raw_data(),
             s.use_momentum ? buf.data<float>() : nullptr, s, call.stream());
}

void sum_squares_cuda(const Tensor& x, int chunks, const Tensor& out) {
  CudaCall call("sum_squares", {&x, &out});
  TESSEL_CHECK(x.is_contiguous(), "sum_squares", "needs a contiguous input, got {}", x.desc());
  TESSEL_CHECK(out.numel() == 1 && out.dtype() == DType::Float32, "sum_squares",
               "output must be one float32 element, got {}", out.desc());
  TESSEL_CHECK(chunks >= 1 && chunks <= 1024 && (chunks & (chunks - 1)) == 0, "sum_squares",
               "chunks must be a power of two in [1, 1024], got {}", chunks);
  launch_sum_squares(x.dtype(), x.raw_data(), x.numel(), chunks, static_cast<float*>(out.raw_data()), call.stream());
}

void scale_inplace_cuda(const Tensor& x, float s) {
  CudaCall call("scale_inplace", {&x});
  launch_scale(x.dtype(), make_elem_geometry<1>({&x}), x.raw_data(), s, call.stream());
}

void amp_unscale_cuda(const Tensor& x, const Tensor& found_inf, float inv_scale) {
  CudaCall call("amp_unscale", {&x, &found_inf});
  TESSEL_CHECK(found_inf.numel() == 1 && found_inf.dtype() == DType::Float32, "amp_unscale",
               "found_inf must be one float32 element, got {}", found_inf.desc());
  launch_amp_unscale(x.dtype(), make_elem_geometry<1>({&x}), x.raw_data(), inv_scale,
                     static_cast<float*>(found_inf.raw_data()), call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(adamw_step, DeviceType::CUDA, adamw_step_cuda);
TESSEL_REGISTER_KERNEL(sgd_step, DeviceType::CUDA, sgd_step_cuda);
TESSEL_REGISTER_KERNEL(sum_squares, DeviceType::CUDA, sum_squares_cuda);
TESSEL_REGISTER_KERNEL(scale_inplace, DeviceType::CUDA, scale_inplace_cuda);
TESSEL_REGISTER_KERNEL(amp_unscale, DeviceType::CUDA, amp_unscale_cuda);

}  // namespace tessel::kernels::cuda
