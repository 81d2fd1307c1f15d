// CUDA unary ops: the expressions of kernels/unary_math.h (shared with the
// CPU, tessel::tmath instead of CUDA's math library, --fmad=false), so float32
// results equal the CPU's bit for bit. Backward is in unary_backward.cu (its own nvcc object: the two compile in parallel).
#include <type_traits>

#include "kernels/cuda/call.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/unary.h"
#include "kernels/unary_math.h"

namespace tessel::kernels::cuda {
namespace {

template <UnaryOp Op, class T>
struct UnaryKernel {
  T* o;
  const T* x;
  __device__ void operator()(const int64_t* off) const {
    using C = acc_t<T>;
    o[off[0]] = narrow<T>(UnaryFn<Op>::template fwd<C>(C(widen(x[off[1]]))));
  }
};

struct LogicalNotKernel {
  bool* o;
  const bool* x;
  __device__ void operator()(const int64_t* off) const { o[off[0]] = !x[off[1]]; }
};

constexpr bool accepts_integers(UnaryOp op) {
  return op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Sign || op == UnaryOp::Square;
}

template <UnaryOp Op>
void unary_dispatch(DType dtype, const ElemGeometry<2>& g, void* out, const void* x, cudaStream_t s) {
  const char* name = unary_op_name(Op);
  if constexpr (Op == UnaryOp::LogicalNot) {
    launch_elementwise<2>(g, LogicalNotKernel{static_cast<bool*>(out), static_cast<const bool*>(x)}, s, name);
  } else if constexpr (accepts_integers(Op)) {
    dispatch_numeric(dtype, name, [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch_elementwise<2>(g, UnaryKernel<Op, T>{static_cast<T*>(out), static_cast<const T*>(x)}, s, name);
    });
  } else {
    dispatch_floating(dtype, name, [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch_elementwise<2>(g, UnaryKernel<Op, T>{static_cast<T*>(out), static_cast<const T*>(x)}, s, name);
    });
  }
}

}  // namespace

#define TESSEL_UNARY_CASES(X)                                                                               \
  X(Neg) X(Abs) X(Sign) X(Exp) X(Log) X(Log1p) X(Expm1) X(Sqrt) X(Rsqrt) X(Sin) X(Cos) X(Tanh) X(Sigmoid) \
  X(Relu) X(Gelu) X(GeluErf) X(Silu) X(Square) X(Reciprocal) X(Erf) X(Floor) X(Ceil) X(Round) X(LogicalNot)

void launch_unary(UnaryOp op, DType dtype, const ElemGeometry<2>& g, void* out, const void* x, cudaStream_t s) {
  switch (op) {
#define X(OP) \
  case UnaryOp::OP: return unary_dispatch<UnaryOp::OP>(dtype, g, out, x, s);
    TESSEL_UNARY_CASES(X)
#undef X
  }
}

}  // namespace tessel::kernels::cuda

// ---- KernelTable adapter: registers the CUDA unary kernel.
namespace tessel::kernels::cuda {
namespace {

void unary_cuda(UnaryOp op, const Tensor& x, const Tensor& out) {
  const char* name = unary_op_name(op);
  CudaCall call(name, {&x, &out});
  launch_unary(op, x.dtype(), make_elem_geometry<2>({&out, &x}), out.raw_data(), x.raw_data(), call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(unary, DeviceType::CUDA, unary_cuda);

}  // namespace tessel::kernels::cuda
