#pragma once
// tessel's headers are C++17 (see runtime/tmath.h: copy the build lines of
// tessel's .bazelrc into a workspace of one's own).
#if __cplusplus < 201703L
#error "tessel needs C++17 and its numerics flags: copy the build lines of tessel's .bazelrc into your workspace's .bazelrc (docs/build.md)"
#endif
// Dims: a small inline vector for shapes and strides (no heap allocation).
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "runtime/error.h"

namespace tessel {

inline constexpr int kMaxDims = 8;

class Dims {
 public:
  Dims() = default;
  Dims(std::initializer_list<int64_t> v) { assign(v.begin(), v.size()); }
  explicit Dims(const std::vector<int64_t>& v) { assign(v.data(), v.size()); }
  Dims(const int64_t* p, size_t n) { assign(p, n); }
  static Dims filled(int n, int64_t value) {
    Dims d;
    d.resize(n, value);
    return d;
  }

  int size() const { return n_; }
  bool empty() const { return n_ == 0; }
  int64_t& operator[](int i) { return d_[i]; }
  int64_t operator[](int i) const { return d_[i]; }
  int64_t* begin() { return d_; }
  int64_t* end() { return d_ + n_; }
  const int64_t* begin() const { return d_; }
  const int64_t* end() const { return d_ + n_; }
  const int64_t* data() const { return d_; }
  int64_t back() const { return d_[n_ - 1]; }

  void push_back(int64_t v) {
    check_capacity(n_ + 1);
    d_[n_++] = v;
  }
  void insert(int pos, int64_t v) {
    check_capacity(n_ + 1);
    for (int i = n_; i > pos; --i) d_[i] = d_[i - 1];
    d_[pos] = v;
    ++n_;
  }
  void erase(int pos) {
    for (int i = pos; i + 1 < n_; ++i) d_[i] = d_[i + 1];
    --n_;
  }
  void resize(int n, int64_t fill = 0) {
    check_capacity(n);
    for (int i = n_; i < n; ++i) d_[i] = fill;
    n_ = n;
  }
  void pop_back() { --n_; }

  std::vector<int64_t> vec() const { return std::vector<int64_t>(d_, d_ + n_); }
  std::string str() const;  // "[2, 3, 4]"

  friend bool operator==(const Dims& a, const Dims& b) {
    if (a.n_ != b.n_) return false;
    for (int i = 0; i < a.n_; ++i)
      if (a.d_[i] != b.d_[i]) return false;
    return true;
  }
  friend bool operator!=(const Dims& a, const Dims& b) { return !(a == b); }

 private:
  template <class It>
  void assign(It p, size_t n) {
    check_capacity(static_cast<int>(n));
    n_ = static_cast<int>(n);
    for (int i = 0; i < n_; ++i) d_[i] = p[i];
  }
  static void check_capacity(int n) {
    if (n > kMaxDims) TESSEL_FAIL("shape", "tensors have at most {} dimensions, got {}", kMaxDims, n);
  }
  int64_t d_[kMaxDims] = {};
  int n_ = 0;
};

using Shape = Dims;

int64_t numel_of(const Dims& shape);
Dims contiguous_strides(const Dims& shape);
// The row-major coordinates of element `linear` of `shape` (error messages:
// "id 64 at position [1, 3]").
Dims coordinates_of(const Dims& shape, int64_t linear);
// Wraps a possibly negative dim index into [0, ndim); error names the op.
int wrap_dim(int64_t dim, int ndim, const char* op);
// The broadcast of two shapes (numpy rules); error names the op and both shapes.
Dims broadcast_shapes(const Dims& a, const Dims& b, const char* op);

}  // namespace tessel

template <>
struct fmt::formatter<tessel::Dims> : fmt::formatter<std::string> {
  template <class Ctx>
  auto format(const tessel::Dims& d, Ctx& ctx) const {
    return fmt::formatter<std::string>::format(d.str(), ctx);
  }
};
