#pragma once
// Element types and the promotion rules between them.
#include <cstddef>
#include <cstdint>
#include <string>

#include "runtime/half.h"

namespace tessel {

enum class DType : uint8_t { Bool, Int32, Int64, Float16, BFloat16, Float32, Float64 };
inline constexpr int kNumDTypes = 7;

size_t itemsize(DType t);
const char* dtype_name(DType t);  // "float32", "bfloat16", ...
DType dtype_from_name(const std::string& name);  // throws tessel::Error on unknown names
inline bool is_floating(DType t) { return t >= DType::Float16; }
inline bool is_integral(DType t) { return t == DType::Int32 || t == DType::Int64; }
inline bool is_half(DType t) { return t == DType::Float16 || t == DType::BFloat16; }

// Type promotion (PyTorch's rules for tensor-tensor operands):
// bool < int32 < int64 < {float16, bfloat16} < float32 < float64, and
// float16 with bfloat16 promotes to float32.
DType promote_types(DType a, DType b);

// The dtype a reduction or an accumulation over this dtype is carried in.
inline DType accumulate_dtype(DType t) {
  return t == DType::Float64 ? DType::Float64 : is_floating(t) ? DType::Float32 : DType::Int64;
}

// C++ type <-> DType.
template <class T> struct dtype_of;
template <> struct dtype_of<bool> { static constexpr DType value = DType::Bool; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::Int32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::Int64; };
template <> struct dtype_of<f16> { static constexpr DType value = DType::Float16; };
template <> struct dtype_of<bf16> { static constexpr DType value = DType::BFloat16; };
template <> struct dtype_of<float> { static constexpr DType value = DType::Float32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::Float64; };
template <class T> inline constexpr DType dtype_v = dtype_of<T>::value;

// The type arithmetic on T is carried out in: 16-bit floats compute in float.
template <class T> struct compute_type { using type = T; };
template <> struct compute_type<f16> { using type = float; };
template <> struct compute_type<bf16> { using type = float; };
template <class T> using compute_t = typename compute_type<T>::type;

// Widening load / narrowing store between storage and compute types.
template <class T> inline compute_t<T> load(T v) { return static_cast<compute_t<T>>(v); }
template <class T> inline T store(compute_t<T> v) { return static_cast<T>(v); }

template <class T> struct TypeTag { using type = T; };

// Calls f(TypeTag<T>{}) with T the C++ type of `t`. `op` names the caller for errors.
// Variants restrict the accepted set and raise tessel::Error for the rest.
template <class F> decltype(auto) dispatch_all(DType t, const char* op, F&& f);
template <class F> decltype(auto) dispatch_floating(DType t, const char* op, F&& f);
template <class F> decltype(auto) dispatch_numeric(DType t, const char* op, F&& f);  // no bool

[[noreturn]] void throw_unsupported_dtype(const char* op, DType t, const char* accepted);

template <class F> decltype(auto) dispatch_all(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Bool: return f(TypeTag<bool>{});
    case DType::Int32: return f(TypeTag<int32_t>{});
    case DType::Int64: return f(TypeTag<int64_t>{});
    case DType::Float16: return f(TypeTag<f16>{});
    case DType::BFloat16: return f(TypeTag<bf16>{});
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
  }
  throw_unsupported_dtype(op, t, "any");
}

template <class F> decltype(auto) dispatch_floating(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Float16: return f(TypeTag<f16>{});
    case DType::BFloat16: return f(TypeTag<bf16>{});
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    default: throw_unsupported_dtype(op, t, "floating point");
  }
}

template <class F> decltype(auto) dispatch_numeric(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::Int32: return f(TypeTag<int32_t>{});
    case DType::Int64: return f(TypeTag<int64_t>{});
    case DType::Float16: return f(TypeTag<f16>{});
    case DType::BFloat16: return f(TypeTag<bf16>{});
    case DType::Float32: return f(TypeTag<float>{});
    case DType::Float64: return f(TypeTag<double>{});
    default: throw_unsupported_dtype(op, t, "numeric (not bool)");
  }
}

}  // namespace tessel
