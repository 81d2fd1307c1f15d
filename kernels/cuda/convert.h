#pragma once
// Element conversions for CUDA kernels, written for host and device with the
// CPU kernels' semantics (kernels/cpu/elementwise.cc `convert`): 16-bit floats
// round to nearest even through float (runtime/half.h, the same integer code
// on both sides), to bool is != 0, float to integer truncates. Checked against
// the CPU copy kernel for every dtype pair in test_cuda_plan.
//
// Not in the contract: float -> integer for values outside the integer's
// range or NaN (undefined in C++; x86 and CUDA give different results).
#include <cstdint>
#include <type_traits>

#include "runtime/dtype.h"
#include "runtime/half.h"
#include "runtime/macros.h"

namespace tessel::kernels::cuda {

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, f16> || std::is_same_v<T, bf16>;

// The arithmetic type of T: float for 16-bit floats, T otherwise.
template <class T>
using acc_t = std::conditional_t<is_half_v<T>, float, T>;

template <class T>
TESSEL_HOST_DEVICE_INLINE acc_t<T> widen(T v) {
  if constexpr (is_half_v<T>) return static_cast<float>(v);
  else return v;
}

// Rounds a compute value C once into storage type T.
template <class T, class C>
TESSEL_HOST_DEVICE_INLINE T narrow(C v) {
  if constexpr (is_half_v<T>) return T(static_cast<float>(v));
  else return static_cast<T>(v);
}

template <class D, class S>
TESSEL_HOST_DEVICE_INLINE D convert(S v) {
  if constexpr (std::is_same_v<D, S>) {
    return v;
  } else if constexpr (std::is_same_v<D, bool>) {
    if constexpr (is_half_v<S>) return static_cast<float>(v) != 0.0f;
    else return v != S(0);
  } else if constexpr (is_half_v<D>) {
    return D(static_cast<float>(widen(v)));  // double -> float -> 16 bits (double rounding, as on the CPU)
  } else if constexpr (is_half_v<S>) {
    return static_cast<D>(static_cast<float>(v));
  } else {
    return static_cast<D>(v);
  }
}

}  // namespace tessel::kernels::cuda
