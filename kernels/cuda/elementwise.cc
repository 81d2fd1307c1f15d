// Registers the CUDA elementwise kernels (elementwise.cu) in the tables of
// kernels/elementwise.h; copy is in copy.cc.
#include <cstring>

#include "kernels/cuda/call.h"
#include "kernels/cuda/elementwise_launch.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/elementwise.h"

namespace tessel::kernels::cuda {
namespace {

void check_same_shape(const char* op, const Tensor& out, std::initializer_list<const Tensor*> ins) {
  for (const Tensor* t : ins)
    TESSEL_CHECK(t->shape() == out.shape(), op, "operand {} and output {} differ in shape (broadcast first)",
                 t->desc(), out.desc());
}

void binary_cuda(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_op_name(op);
  CudaCall call(name, {&a, &b, &out});
  check_same_shape(name, out, {&a, &b});
  TESSEL_CHECK(a.dtype() == b.dtype(), name, "operands {} and {} differ in dtype", a.desc(), b.desc());
  const DType want = is_comparison(op) || is_logical(op) ? DType::Bool : a.dtype();
  TESSEL_CHECK(out.dtype() == want, name, "output {} must be {} for inputs {}", out.desc(), dtype_name(want),
               a.desc());
  launch_binary(op, a.dtype(), make_elem_geometry<3>({&out, &a, &b}), out.raw_data(), a.raw_data(), b.raw_data(),
                call.stream());
}

void fill_cuda(const Tensor& dst, Scalar value) {
  CudaCall call("fill", {&dst});
  uint64_t bits = 0;
  dispatch_all(dst.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = value.to<T>();
    std::memcpy(&bits, &v, sizeof(T));
  });
  launch_fill(dst.dtype(), bits, make_elem_geometry<1>({&dst}), dst.raw_data(), call.stream());
}

void where_cuda(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  CudaCall call("where", {&cond, &a, &b, &out});
  check_same_shape("where", out, {&cond, &a, &b});
  TESSEL_CHECK(cond.dtype() == DType::Bool && a.dtype() == out.dtype() && b.dtype() == out.dtype(), "where",
               "needs a bool condition and operands of the output's dtype, got {}, {}, {} -> {}", cond.desc(),
               a.desc(), b.desc(), out.desc());
  launch_where(out.dtype(), make_elem_geometry<4>({&out, &cond, &a, &b}), out.raw_data(),
               static_cast<const bool*>(cond.raw_data()), a.raw_data(), b.raw_data(), call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(binary, DeviceType::CUDA, binary_cuda);
TESSEL_REGISTER_KERNEL(fill, DeviceType::CUDA, fill_cuda);
TESSEL_REGISTER_KERNEL(where, DeviceType::CUDA, where_cuda);

}  // namespace tessel::kernels::cuda
