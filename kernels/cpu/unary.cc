// CPU unary elementwise kernels (formulas in kernels/unary_math.h).
#include <type_traits>

#include "kernels/cpu/loops.h"
#include "kernels/unary.h"
#include "kernels/unary_math.h"

namespace tessel::kernels::cpu {
namespace {

template <UnaryOp Op, class T>
void unary_typed(const Tensor& x, const Tensor& out) {
  using C = compute_t<T>;
  strided_loop<2>({&out, &x}, kElementwiseGrain, [](int64_t n, char* const* p, const int64_t* s) {
    T* o = reinterpret_cast<T*>(p[0]);
    const T* a = reinterpret_cast<const T*>(p[1]);
    const int64_t st = sizeof(T);
    if (s[0] == st && s[1] == st) {
      for (int64_t i = 0; i < n; ++i) o[i] = store<T>(UnaryFn<Op>::fwd(C(load(a[i]))));
    } else {
      const int64_t so = s[0] / st, sa = s[1] / st;
      for (int64_t i = 0; i < n; ++i) o[i * so] = store<T>(UnaryFn<Op>::fwd(C(load(a[i * sa]))));
    }
  });
}

template <UnaryOp Op, class T>
void unary_backward_typed(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& dx) {
  using C = compute_t<T>;
  strided_loop<4>({&dx, &g, &x, &y}, kElementwiseGrain, [](int64_t n, char* const* p, const int64_t* s) {
    T* o = reinterpret_cast<T*>(p[0]);
    const T* gg = reinterpret_cast<const T*>(p[1]);
    const T* xx = reinterpret_cast<const T*>(p[2]);
    const T* yy = reinterpret_cast<const T*>(p[3]);
    const int64_t st = sizeof(T);
    if (s[0] == st && s[1] == st && s[2] == st && s[3] == st) {
      for (int64_t i = 0; i < n; ++i) o[i] = store<T>(UnaryFn<Op>::bwd(C(load(gg[i])), C(load(xx[i])), C(load(yy[i]))));
    } else {
      const int64_t s0 = s[0] / st, s1 = s[1] / st, s2 = s[2] / st, s3 = s[3] / st;
      for (int64_t i = 0; i < n; ++i)
        o[i * s0] = store<T>(UnaryFn<Op>::bwd(C(load(gg[i * s1])), C(load(xx[i * s2])), C(load(yy[i * s3]))));
    }
  });
}

constexpr bool accepts_integers(UnaryOp op) {
  return op == UnaryOp::Neg || op == UnaryOp::Abs || op == UnaryOp::Sign || op == UnaryOp::Square;
}

template <UnaryOp Op>
void unary_dispatch(const Tensor& x, const Tensor& out) {
  if constexpr (Op == UnaryOp::LogicalNot) {
    strided_loop<2>({&out, &x}, kElementwiseGrain, [](int64_t n, char* const* p, const int64_t* s) {
      for (int64_t i = 0; i < n; ++i) *reinterpret_cast<bool*>(p[0] + i * s[0]) = !*reinterpret_cast<const bool*>(p[1] + i * s[1]);
    });
  } else if constexpr (accepts_integers(Op)) {
    dispatch_numeric(x.dtype(), unary_op_name(Op), [&](auto tag) { unary_typed<Op, typename decltype(tag)::type>(x, out); });
  } else {
    dispatch_floating(x.dtype(), unary_op_name(Op), [&](auto tag) { unary_typed<Op, typename decltype(tag)::type>(x, out); });
  }
}

template <UnaryOp Op>
void unary_backward_dispatch(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& dx) {
  if constexpr (Op == UnaryOp::LogicalNot) {
    TESSEL_FAIL("logical_not", "is not differentiable");
  } else {
    dispatch_floating(x.dtype(), unary_op_name(Op),
                      [&](auto tag) { unary_backward_typed<Op, typename decltype(tag)::type>(g, x, y, dx); });
  }
}

#define TESSEL_UNARY_CASES(X)                                                                               \
  X(Neg) X(Abs) X(Sign) X(Exp) X(Log) X(Log1p) X(Expm1) X(Sqrt) X(Rsqrt) X(Sin) X(Cos) X(Tanh) X(Sigmoid) \
  X(Relu) X(Gelu) X(GeluErf) X(Silu) X(Square) X(Reciprocal) X(Erf) X(Floor) X(Ceil) X(Round) X(LogicalNot)

void unary_cpu(UnaryOp op, const Tensor& x, const Tensor& out) {
  switch (op) {
#define X(OP) \
  case UnaryOp::OP: return unary_dispatch<UnaryOp::OP>(x, out);
    TESSEL_UNARY_CASES(X)
#undef X
  }
}

void unary_backward_cpu(UnaryOp op, const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& dx) {
  switch (op) {
#define X(OP) \
  case UnaryOp::OP: return unary_backward_dispatch<UnaryOp::OP>(g, x, y, dx);
    TESSEL_UNARY_CASES(X)
#undef X
  }
}

}  // namespace

TESSEL_REGISTER_KERNEL(unary, DeviceType::CPU, unary_cpu);
TESSEL_REGISTER_KERNEL(unary_backward, DeviceType::CPU, unary_backward_cpu);

}  // namespace tessel::kernels::cpu
