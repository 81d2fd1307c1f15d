// CUDA unary backward: dx = UnaryFn<op>::bwd(g, x, y) (kernels/unary_math.h),
// floating types only, computed in float for 16-bit storage.
#include "kernels/cuda/call.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/unary.h"
#include "kernels/unary_math.h"

namespace tessel::kernels::cuda {
namespace {

template <UnaryOp Op, class T>
struct UnaryBackwardKernel {
  T* dx;
  const T* g;
  const T* x;
  const T* y;
  __device__ void operator()(const int64_t* off) const {
    using C = acc_t<T>;
    dx[off[0]] = narrow<T>(
        UnaryFn<Op>::template bwd<C>(C(widen(g[off[1]])), C(widen(x[off[2]])), C(widen(y[off[3]]))));
  }
};

template <UnaryOp Op>
void backward_dispatch(DType dtype, const ElemGeometry<4>& geo, void* dx, const void* g, const void* x, const void* y,
                       cudaStream_t s) {
  const char* name = unary_op_name(Op);
  if constexpr (Op == UnaryOp::LogicalNot) {
    fail(name, "is not differentiable");
  } else {
    dispatch_floating(dtype, name, [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch_elementwise<4>(geo,
                            UnaryBackwardKernel<Op, T>{static_cast<T*>(dx), static_cast<const T*>(g),
                                                       static_cast<const T*>(x), static_cast<const T*>(y)},
                            s, name);
    });
  }
}

}  // namespace

#define TESSEL_UNARY_CASES(X)                                                                               \
  X(Neg) X(Abs) X(Sign) X(Exp) X(Log) X(Log1p) X(Expm1) X(Sqrt) X(Rsqrt) X(Sin) X(Cos) X(Tanh) X(Sigmoid) \
  X(Relu) X(Gelu) X(GeluErf) X(Silu) X(Square) X(Reciprocal) X(Erf) X(Floor) X(Ceil) X(Round) X(LogicalNot)

void launch_unary_backward(UnaryOp op, DType dtype, const ElemGeometry<4>& geo, void* dx, const void* g,
                           const void* x, const void* y, cudaStream_t s) {
  switch (op) {
#define X(OP) \
  case UnaryOp::OP: return backward_dispatch<UnaryOp::OP>(dtype, geo, dx, g, x, y, s);
    TESSEL_UNARY_CASES(X)
#undef X
  }
}

}  // namespace tessel::kernels::cuda

// ---- KernelTable adapter: registers the CUDA unary backward kernel.
namespace tessel::kernels::cuda {
namespace {

void unary_backward_cuda(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& dx) {
  const char* name = unary_op_name(op);
  CudaCall call(name, {&g, &x, &y, &dx});
  launch_unary_backward(op, dx.dtype(), make_elem_geometry<4>({&dx, &g, &x, &y}), dx.raw_data(), g.raw_data(),
                        x.raw_data(), y.raw_data(), call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(unary_backward, DeviceType::CUDA, unary_backward_cuda);

}  // namespace tessel::kernels::cuda
