// CUDA binary ops, fill and where: one thread per element, the CPU kernels'
// formulas (kernels/cpu/elementwise.cc) evaluated in the same compute type
// (16-bit floats in float, rounded once on store). Built with --fmad=false, so
// add/sub/mul/div are single IEEE operations as on the CPU; `pow` uses CUDA's
// powf/pow (not bitwise equal to the CPU's std::pow: tested with a tolerance).
#include <cstdint>
#include <cstring>
#include <cuda_runtime.h>
#include <type_traits>

#include "kernels/cuda/call.h"
#include "kernels/cuda/convert.h"
#include "kernels/cuda/geometry.h"
#include "kernels/cuda/geometry_build.h"
#include "kernels/cuda/loops.cuh"
#include "kernels/elementwise.h"

// ---- launch interface: what the adapters at the end call ----
// Operand 0 of every geometry is
// the output. All launches are asynchronous on `stream`.
namespace tessel::kernels::cuda {

// out = op(a, b); a and b have dtype `dtype`, out has it too (bool for
// comparisons and logical ops). Operands: out, a, b.
void launch_binary(BinaryOp op, DType dtype, const ElemGeometry<3>& g, void* out, const void* a, const void* b,
                   cudaStream_t stream);
// dst = value (its bytes, already converted to dtype, in the low bytes).
void launch_fill(DType dtype, uint64_t value_bits, const ElemGeometry<1>& g, void* dst, cudaStream_t stream);
// out = cond ? a : b. Operands: out, cond, a, b.
void launch_where(DType dtype, const ElemGeometry<4>& g, void* out, const bool* cond, const void* a, const void* b,
                  cudaStream_t stream);

}  // namespace tessel::kernels::cuda

namespace tessel::kernels::cuda {
namespace {

template <class T>
__device__ __forceinline__ T nan_max(T a, T b) {
  return a != a ? a : (b != b ? b : (a > b ? a : b));
}
template <class T>
__device__ __forceinline__ T nan_min(T a, T b) {
  return a != a ? a : (b != b ? b : (a < b ? a : b));
}

template <BinaryOp Op, class C>
__device__ __forceinline__ auto apply_binary(C a, C b) {
  if constexpr (Op == BinaryOp::Add) return C(a + b);
  else if constexpr (Op == BinaryOp::Sub) return C(a - b);
  else if constexpr (Op == BinaryOp::Mul) return C(a * b);
  else if constexpr (Op == BinaryOp::Div) return C(a / b);
  else if constexpr (Op == BinaryOp::Maximum) return nan_max(a, b);
  else if constexpr (Op == BinaryOp::Minimum) return nan_min(a, b);
  else if constexpr (Op == BinaryOp::Pow) return C(pow(a, b));
  else if constexpr (Op == BinaryOp::Eq) return a == b;
  else if constexpr (Op == BinaryOp::Ne) return a != b;
  else if constexpr (Op == BinaryOp::Lt) return a < b;
  else if constexpr (Op == BinaryOp::Le) return a <= b;
  else if constexpr (Op == BinaryOp::Gt) return a > b;
  else if constexpr (Op == BinaryOp::Ge) return a >= b;
  else if constexpr (Op == BinaryOp::LogicalAnd) return bool(a) && bool(b);
  else if constexpr (Op == BinaryOp::LogicalOr) return bool(a) || bool(b);
  else return bool(a) != bool(b);
}

template <BinaryOp Op, class T>
struct BinaryFn {
  static constexpr bool kBoolOut = is_comparison(Op) || is_logical(Op);
  using Out = std::conditional_t<kBoolOut, bool, T>;
  using C = acc_t<T>;
  Out* o;
  const T* a;
  const T* b;
  __device__ void operator()(const int64_t* off) const {
    const auto r = apply_binary<Op, C>(widen(a[off[1]]), widen(b[off[2]]));
    if constexpr (kBoolOut) o[off[0]] = r;
    else o[off[0]] = narrow<T>(r);
  }
};

template <BinaryOp Op, class T>
void binary_typed(const ElemGeometry<3>& g, void* out, const void* a, const void* b, cudaStream_t s) {
  using Fn = BinaryFn<Op, T>;
  launch_elementwise<3>(g, Fn{static_cast<typename Fn::Out*>(out), static_cast<const T*>(a), static_cast<const T*>(b)},
                        s, binary_op_name(Op));
}

template <BinaryOp Op>
void binary_dispatch(DType dtype, const ElemGeometry<3>& g, void* out, const void* a, const void* b, cudaStream_t s) {
  const char* name = binary_op_name(Op);
  if constexpr (is_logical(Op)) {
    binary_typed<Op, bool>(g, out, a, b, s);
  } else if constexpr (Op == BinaryOp::Div || Op == BinaryOp::Pow) {
    dispatch_floating(dtype, name, [&](auto tag) { binary_typed<Op, typename decltype(tag)::type>(g, out, a, b, s); });
  } else {
    dispatch_all(dtype, name, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, bool> && !is_comparison(Op)) {
        // bool arithmetic as on the CPU: add/max are or, mul/min are and.
        if constexpr (Op == BinaryOp::Add || Op == BinaryOp::Maximum)
          binary_typed<BinaryOp::LogicalOr, bool>(g, out, a, b, s);
        else if constexpr (Op == BinaryOp::Mul || Op == BinaryOp::Minimum)
          binary_typed<BinaryOp::LogicalAnd, bool>(g, out, a, b, s);
        else
          throw_unsupported_dtype(name, DType::Bool, "numeric");
      } else {
        binary_typed<Op, T>(g, out, a, b, s);
      }
    });
  }
}

template <class T>
struct FillFn {
  T* o;
  T v;
  __device__ void operator()(const int64_t* off) const { o[off[0]] = v; }
};

template <class T>
struct WhereFn {
  T* o;
  const bool* c;
  const T* a;
  const T* b;
  __device__ void operator()(const int64_t* off) const { o[off[0]] = c[off[1]] ? a[off[2]] : b[off[3]]; }
};

}  // namespace

void launch_binary(BinaryOp op, DType dtype, const ElemGeometry<3>& g, void* out, const void* a, const void* b,
                   cudaStream_t s) {
  switch (op) {
#define TESSEL_CASE(OP) \
  case BinaryOp::OP: return binary_dispatch<BinaryOp::OP>(dtype, g, out, a, b, s);
    TESSEL_CASE(Add) TESSEL_CASE(Sub) TESSEL_CASE(Mul) TESSEL_CASE(Div) TESSEL_CASE(Maximum) TESSEL_CASE(Minimum)
    TESSEL_CASE(Pow) TESSEL_CASE(Eq) TESSEL_CASE(Ne) TESSEL_CASE(Lt) TESSEL_CASE(Le) TESSEL_CASE(Gt) TESSEL_CASE(Ge)
    TESSEL_CASE(LogicalAnd) TESSEL_CASE(LogicalOr) TESSEL_CASE(LogicalXor)
#undef TESSEL_CASE
  }
}

void launch_fill(DType dtype, uint64_t value_bits, const ElemGeometry<1>& g, void* dst, cudaStream_t s) {
  dispatch_all(dtype, "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    T v;
    std::memcpy(&v, &value_bits, sizeof(T));
    launch_elementwise<1>(g, FillFn<T>{static_cast<T*>(dst), v}, s, "fill");
  });
}

void launch_where(DType dtype, const ElemGeometry<4>& g, void* out, const bool* cond, const void* a, const void* b,
                  cudaStream_t s) {
  dispatch_all(dtype, "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    launch_elementwise<4>(
        g, WhereFn<T>{static_cast<T*>(out), cond, static_cast<const T*>(a), static_cast<const T*>(b)}, s, "where");
  });
}

}  // namespace tessel::kernels::cuda

// ---- KernelTable adapters: register the CUDA elementwise kernels in the tables of
// kernels/elementwise.h; copy is in copy.cu.
namespace tessel::kernels::cuda {
namespace {

void binary_cuda(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_op_name(op);
  CudaCall call(name, {&a, &b, &out});
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
  launch_where(out.dtype(), make_elem_geometry<4>({&out, &cond, &a, &b}), out.raw_data(),
               static_cast<const bool*>(cond.raw_data()), a.raw_data(), b.raw_data(), call.stream());
}

}  // namespace

TESSEL_REGISTER_KERNEL(binary, DeviceType::CUDA, binary_cuda);
TESSEL_REGISTER_KERNEL(fill, DeviceType::CUDA, fill_cuda);
TESSEL_REGISTER_KERNEL(where, DeviceType::CUDA, where_cuda);

}  // namespace tessel::kernels::cuda
