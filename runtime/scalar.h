#pragma once
// A dtype-tagged number: the scalar operand of `x * 2`, `fill_(0)`, ...
#include <cstdint>
#include <type_traits>

#include "runtime/dtype.h"

namespace tessel {

class Scalar {
 public:
  Scalar() = default;
  template <class T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Scalar(T v) : d_(static_cast<double>(v)), i_(static_cast<int64_t>(v)), kind_(Kind::Float) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Scalar(T v) : d_(static_cast<double>(v)), i_(static_cast<int64_t>(v)), kind_(Kind::Int) {}
  Scalar(bool v) : d_(v ? 1.0 : 0.0), i_(v ? 1 : 0), kind_(Kind::Bool) {}

  bool is_floating() const { return kind_ == Kind::Float; }
  bool is_integral() const { return kind_ == Kind::Int; }
  bool is_bool() const { return kind_ == Kind::Bool; }
  double to_double() const { return d_; }
  int64_t to_int() const { return i_; }

  // Value converted to the C++ type T (16-bit floats round to nearest even).
  template <class T> T to() const {
    if constexpr (std::is_same_v<T, bool>) return kind_ == Kind::Float ? d_ != 0.0 : i_ != 0;
    else if constexpr (std::is_integral_v<T>) return static_cast<T>(kind_ == Kind::Float ? static_cast<int64_t>(d_) : i_);
    else if constexpr (std::is_same_v<T, double>) return d_;
    else if constexpr (std::is_same_v<T, float>) return static_cast<float>(d_);
    else return T(static_cast<float>(d_));
  }

  // The dtype a tensor of dtype `t` combined with this scalar promotes to: a
  // scalar never widens a tensor within its category (int tensor * 2 stays
  // int32, float16 * 0.5 stays float16), but a float scalar makes an integral
  // or bool tensor float32, and an int scalar makes a bool tensor int64.
  DType result_dtype(DType t) const {
    if (kind_ == Kind::Float && !tessel::is_floating(t)) return DType::Float32;
    if (kind_ == Kind::Int && t == DType::Bool) return DType::Int64;
    return t;
  }

 private:
  enum class Kind : uint8_t { Float, Int, Bool };
  double d_ = 0.0;
  int64_t i_ = 0;
  Kind kind_ = Kind::Int;
};

}  // namespace tessel
