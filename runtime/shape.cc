#include "runtime/shape.h"

namespace tessel {

std::string Dims::str() const {
  std::string s = "[";
  for (int i = 0; i < n_; ++i) {
    if (i) s += ", ";
    s += std::to_string(d_[i]);
  }
  return s + "]";
}

int64_t numel_of(const Dims& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

Dims contiguous_strides(const Dims& shape) {
  Dims st = Dims::filled(shape.size(), 1);
  int64_t acc = 1;
  for (int i = shape.size() - 1; i >= 0; --i) {
    st[i] = acc;
    acc *= shape[i] > 0 ? shape[i] : 1;
  }
  return st;
}

Dims coordinates_of(const Dims& shape, int64_t linear) {
  Dims c = Dims::filled(shape.size(), 0);
  for (int d = shape.size() - 1; d >= 0; --d) {
    if (shape[d] <= 0) continue;
    c[d] = linear % shape[d];
    linear /= shape[d];
  }
  return c;
}

int wrap_dim(int64_t dim, int ndim, const char* op) {
  int64_t lo = ndim > 0 ? -ndim : -1, hi = ndim > 0 ? ndim - 1 : 0;
  TESSEL_CHECK(dim >= lo && dim <= hi, op, "dimension {} is out of range for a tensor with {} dimensions (expected {}..{})",
               dim, ndim, lo, hi);
  return static_cast<int>(dim < 0 ? dim + (ndim > 0 ? ndim : 1) : dim);
}

Dims broadcast_shapes(const Dims& a, const Dims& b, const char* op) {
  int n = a.size() > b.size() ? a.size() : b.size();
  Dims out = Dims::filled(n, 1);
  for (int i = 0; i < n; ++i) {
    int ia = a.size() - n + i, ib = b.size() - n + i;
    int64_t sa = ia >= 0 ? a[ia] : 1, sb = ib >= 0 ? b[ib] : 1;
    TESSEL_CHECK(sa == sb || sa == 1 || sb == 1, op, "shapes {} and {} cannot be broadcast (dimension {}: {} vs {})",
                 a, b, i, sa, sb);
    out[i] = sa == 1 ? sb : sa;
  }
  return out;
}

}  // namespace tessel
