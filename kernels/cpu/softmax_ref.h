#pragma once
// Plain scalar references for the softmax kernels: the documented order of
// kernels/softmax.h written as simply as possible, one contiguous row of the
// compute type at a time. Tests compare kernels/cpu/softmax.cc to these bit
// for bit (test/test_softmax.cc).
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/canonical.h"
#include "runtime/tmath.h"

namespace tessel::kernels::ref {

template <class C>
C row_max(const C* x, int64_t n) {
  C m = -std::numeric_limits<C>::infinity();
  for (int64_t i = 0; i < n; ++i) m = MaxCombine<C>()(m, x[i]);
  return m + C(0);
}

template <class C>
std::vector<C> softmax_row(const std::vector<C>& x, int v, bool log) {
  const int64_t n = int64_t(x.size());
  const C m = row_max(x.data(), n);
  std::vector<C> e(x.size()), y(x.size());
  for (int64_t i = 0; i < n; ++i) e[size_t(i)] = tmath::exp(x[size_t(i)] - m);
  const C s = canonical_sum_ref<C>(e.data(), n, 1, v);
  for (int64_t i = 0; i < n; ++i) {
    if (log) y[size_t(i)] = (x[size_t(i)] - m) - tmath::log(s);
    else y[size_t(i)] = e[size_t(i)] * (C(1) / s);
  }
  return y;
}

template <class C>
std::vector<C> softmax_backward_row(const std::vector<C>& g, const std::vector<C>& y, int v, bool log) {
  const int64_t n = int64_t(g.size());
  std::vector<C> dx(g.size());
  if (!log) {
    std::vector<C> p(g.size());
    for (size_t i = 0; i < g.size(); ++i) p[i] = g[i] * y[i];
    const C d = canonical_sum_ref<C>(p.data(), n, 1, v);
    for (size_t i = 0; i < g.size(); ++i) dx[i] = y[i] * (g[i] - d);
  } else {
    const C s = canonical_sum_ref<C>(g.data(), n, 1, v);
    for (size_t i = 0; i < g.size(); ++i) dx[i] = g[i] - tmath::exp(y[i]) * s;
  }
  return dx;
}

}  // namespace tessel::kernels::ref
