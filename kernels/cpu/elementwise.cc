// CPU elementwise kernels: binary ops, copy/cast, fill, where.
#include <cmath>
#include <type_traits>

#include "kernels/cpu/loops.h"
#include "kernels/elementwise.h"

namespace tessel::kernels::cpu {
namespace {

template <class T> inline T nan_max(T a, T b) { return a != a ? a : (b != b ? b : (a > b ? a : b)); }
template <class T> inline T nan_min(T a, T b) { return a != a ? a : (b != b ? b : (a < b ? a : b)); }

template <BinaryOp Op, class C>
inline auto apply_binary(C a, C b) {
  if constexpr (Op == BinaryOp::Add) return C(a + b);
  else if constexpr (Op == BinaryOp::Sub) return C(a - b);
  else if constexpr (Op == BinaryOp::Mul) return C(a * b);
  else if constexpr (Op == BinaryOp::Div) return C(a / b);
  else if constexpr (Op == BinaryOp::Maximum) return nan_max(a, b);
  else if constexpr (Op == BinaryOp::Minimum) return nan_min(a, b);
  else if constexpr (Op == BinaryOp::Pow) return C(std::pow(a, b));
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
void binary_typed(const Tensor& a, const Tensor& b, const Tensor& out) {
  using C = compute_t<T>;
  constexpr bool kBoolOut = is_comparison(Op) || is_logical(Op);
  using Out = std::conditional_t<kBoolOut, bool, T>;
  strided_loop<3>({&out, &a, &b}, kElementwiseGrain, [](int64_t n, char* const* p, const int64_t* s) {
    Out* o = reinterpret_cast<Out*>(p[0]);
    const T* x = reinterpret_cast<const T*>(p[1]);
    const T* y = reinterpret_cast<const T*>(p[2]);
    auto f = [](T u, T v) -> Out {
      constexpr bool kBool = is_comparison(Op) || is_logical(Op);
      if constexpr (kBool) return apply_binary<Op, C>(load(u), load(v));
      else return store<T>(apply_binary<Op, C>(load(u), load(v)));
    };
    const int64_t so = sizeof(Out), st = sizeof(T);
    if (s[0] == so && s[1] == st && s[2] == st) {
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], y[i]);
    } else if (s[0] == so && s[1] == st && s[2] == 0) {
      const T yv = *y;
      for (int64_t i = 0; i < n; ++i) o[i] = f(x[i], yv);
    } else if (s[0] == so && s[1] == 0 && s[2] == st) {
      const T xv = *x;
      for (int64_t i = 0; i < n; ++i) o[i] = f(xv, y[i]);
    } else {
      const int64_t a0 = s[0] / so, a1 = s[1] / st, a2 = s[2] / st;
      for (int64_t i = 0; i < n; ++i) o[i * a0] = f(x[i * a1], y[i * a2]);
    }
  });
}

template <BinaryOp Op>
void binary_dispatch(const Tensor& a, const Tensor& b, const Tensor& out) {
  const char* name = binary_op_name(Op);
  if constexpr (is_logical(Op)) {
    binary_typed<Op, bool>(a, b, out);
  } else if constexpr (Op == BinaryOp::Div || Op == BinaryOp::Pow) {
    dispatch_floating(a.dtype(), name, [&](auto tag) { binary_typed<Op, typename decltype(tag)::type>(a, b, out); });
  } else {
    dispatch_all(a.dtype(), name, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (std::is_same_v<T, bool> && !is_comparison(Op)) {
        // bool arithmetic: add is or, mul is and, max is or, min is and (as in PyTorch).
        if constexpr (Op == BinaryOp::Add || Op == BinaryOp::Maximum) binary_typed<BinaryOp::LogicalOr, bool>(a, b, out);
        else if constexpr (Op == BinaryOp::Mul || Op == BinaryOp::Minimum) binary_typed<BinaryOp::LogicalAnd, bool>(a, b, out);
        else throw_unsupported_dtype(name, DType::Bool, "numeric");
      } else {
        binary_typed<Op, T>(a, b, out);
      }
    });
  }
}

void binary_cpu(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out) {
  switch (op) {
#define TESSEL_CASE(OP) \
  case BinaryOp::OP: return binary_dispatch<BinaryOp::OP>(a, b, out);
    TESSEL_CASE(Add) TESSEL_CASE(Sub) TESSEL_CASE(Mul) TESSEL_CASE(Div) TESSEL_CASE(Maximum) TESSEL_CASE(Minimum)
    TESSEL_CASE(Pow) TESSEL_CASE(Eq) TESSEL_CASE(Ne) TESSEL_CASE(Lt) TESSEL_CASE(Le) TESSEL_CASE(Gt) TESSEL_CASE(Ge)
    TESSEL_CASE(LogicalAnd) TESSEL_CASE(LogicalOr) TESSEL_CASE(LogicalXor)
#undef TESSEL_CASE
  }
}

// Conversion between any two element types.
template <class D, class S>
inline D convert(S v) {
  if constexpr (std::is_same_v<D, S>) return v;
  else if constexpr (std::is_same_v<D, bool>) {
    if constexpr (std::is_same_v<S, f16> || std::is_same_v<S, bf16>) return static_cast<float>(v) != 0.0f;
    else return v != S(0);
  } else if constexpr (std::is_same_v<D, f16> || std::is_same_v<D, bf16>) {
    if constexpr (std::is_same_v<S, f16> || std::is_same_v<S, bf16>) return D(static_cast<float>(v));
    else if constexpr (std::is_same_v<S, double>) return D(static_cast<float>(v));  // double rounding accepted
    else return D(static_cast<float>(v));
  } else if constexpr (std::is_same_v<S, f16> || std::is_same_v<S, bf16>) {
    return static_cast<D>(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

template <class D, class S>
void copy_typed(const Tensor& src, const Tensor& dst) {
  strided_loop<2>({&dst, &src}, kElementwiseGrain, [](int64_t n, char* const* p, const int64_t* s) {
    D* o = reinterpret_cast<D*>(p[0]);
    const S* x = reinterpret_cast<const S*>(p[1]);
    if (s[0] == int64_t(sizeof(D)) && s[1] == int64_t(sizeof(S))) {
      for (int64_t i = 0; i < n; ++i) o[i] = convert<D, S>(x[i]);
    } else if (s[0] == int64_t(sizeof(D)) && s[1] == 0) {
      const D v = convert<D, S>(*x);
      for (int64_t i = 0; i < n; ++i) o[i] = v;
    } else {
      const int64_t a0 = s[0] / int64_t(sizeof(D)), a1 = s[1] / int64_t(sizeof(S));
      for (int64_t i = 0; i < n; ++i) o[i * a0] = convert<D, S>(x[i * a1]);
    }
  });
}

void copy_cpu(const Tensor& src, const Tensor& dst) {
  // The one shape check left in an elementwise kernel: copy has no op in
  // front of it but many callers below the tape (copy_, to, redistribute, the
  // data-parallel buckets, pipeline stages), and a mismatch would write out of
  // bounds.
  TESSEL_CHECK(src.shape() == dst.shape(), "copy", "source {} and destination {} differ in shape", src.desc(),
               dst.desc());
  dispatch_all(dst.dtype(), "copy", [&](auto dtag) {
    using D = typename decltype(dtag)::type;
    dispatch_all(src.dtype(), "copy", [&](auto stag) { copy_typed<D, typename decltype(stag)::type>(src, dst); });
  });
}

void fill_cpu(const Tensor& dst, Scalar value) {
  dispatch_all(dst.dtype(), "fill", [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = value.to<T>();
    strided_loop<1>({&dst}, kElementwiseGrain, [v](int64_t n, char* const* p, const int64_t* s) {
      T* o = reinterpret_cast<T*>(p[0]);
      if (s[0] == int64_t(sizeof(T))) {
        for (int64_t i = 0; i < n; ++i) o[i] = v;
      } else {
        const int64_t a0 = s[0] / int64_t(sizeof(T));
        for (int64_t i = 0; i < n; ++i) o[i * a0] = v;
      }
    });
  });
}

void where_cpu(const Tensor& cond, const Tensor& a, const Tensor& b, const Tensor& out) {
  dispatch_all(out.dtype(), "where", [&](auto tag) {
    using T = typename decltype(tag)::type;
    strided_loop<4>({&out, &cond, &a, &b}, kElementwiseGrain, [](int64_t n, char* const* p, const int64_t* s) {
      T* o = reinterpret_cast<T*>(p[0]);
      const bool* c = reinterpret_cast<const bool*>(p[1]);
      const T* x = reinterpret_cast<const T*>(p[2]);
      const T* y = reinterpret_cast<const T*>(p[3]);
      const int64_t st = sizeof(T);
      if (s[0] == st && s[1] == 1 && s[2] == st && s[3] == st) {
        for (int64_t i = 0; i < n; ++i) o[i] = c[i] ? x[i] : y[i];
      } else {
        const int64_t a0 = s[0] / st, a1 = s[1], a2 = s[2] / st, a3 = s[3] / st;
        for (int64_t i = 0; i < n; ++i) o[i * a0] = c[i * a1] ? x[i * a2] : y[i * a3];
      }
    });
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(binary, DeviceType::CPU, binary_cpu);
TESSEL_REGISTER_KERNEL(copy, DeviceType::CPU, copy_cpu);
TESSEL_REGISTER_KERNEL(fill, DeviceType::CPU, fill_cpu);
TESSEL_REGISTER_KERNEL(where, DeviceType::CPU, where_cpu);

}  // namespace tessel::kernels::cpu
