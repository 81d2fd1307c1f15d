#pragma once
// Plain scalar references for the norm kernels: kernels/norm.h's order written
// as simply as possible on row-major [m, n] vectors of the compute type.
// test/test_norm.cc compares kernels/cpu/norm.cc to these bit for bit.
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/canonical.h"

namespace tessel::kernels::ref {

template <class C>
struct NormForward {
  std::vector<C> y, mean, rstd;
};

// w / b empty: absent.
template <class C>
NormForward<C> norm_forward(const std::vector<C>& x, int64_t m, int64_t n, const std::vector<C>& w,
                            const std::vector<C>& b, double eps, bool rms, int v) {
  NormForward<C> out;
  out.y.resize(x.size());
  out.mean.assign(size_t(m), C(0));
  out.rstd.resize(size_t(m));
  std::vector<C> q(static_cast<size_t>(n));
  for (int64_t r = 0; r < m; ++r) {
    const C* xr = x.data() + r * n;
    C mu = C(0);
    if (!rms) mu = canonical_sum_ref<C>(xr, n, 1, v) / C(n);
    for (int64_t i = 0; i < n; ++i) q[size_t(i)] = rms ? xr[i] * xr[i] : (xr[i] - mu) * (xr[i] - mu);
    const C rs = C(1) / std::sqrt(canonical_sum_ref<C>(q.data(), n, 1, v) / C(n) + C(eps));
    for (int64_t i = 0; i < n; ++i) {
      C h = rms ? xr[i] * rs : (xr[i] - mu) * rs;
      if (!w.empty()) h = h * w[size_t(i)];
      if (!b.empty()) h = h + b[size_t(i)];
      out.y[size_t(r * n + i)] = h;
    }
    out.mean[size_t(r)] = mu;
    out.rstd[size_t(r)] = rs;
  }
  return out;
}

template <class C>
struct NormBackward {
  std::vector<C> dx, dw, db;
};

template <class C>
NormBackward<C> norm_backward(const std::vector<C>& g, const std::vector<C>& x, int64_t m, int64_t n,
                              const std::vector<C>& w, const std::vector<C>& mean, const std::vector<C>& rstd,
                              bool rms, int v) {
  NormBackward<C> out;
  out.dx.resize(x.size());
  std::vector<C> xhat(x.size()), gxhat(x.size()), gw(static_cast<size_t>(n)), p(gw.size());
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < n; ++i) {
      size_t k = size_t(r * n + i);
      xhat[k] = rms ? x[k] * rstd[size_t(r)] : (x[k] - mean[size_t(r)]) * rstd[size_t(r)];
      gxhat[k] = g[k] * xhat[k];
    }
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      size_t k = size_t(r * n + i);
      gw[size_t(i)] = w.empty() ? g[k] : g[k] * w[size_t(i)];
      p[size_t(i)] = gw[size_t(i)] * xhat[k];
    }
    const C bb = canonical_sum_ref<C>(p.data(), n, 1, v) / C(n);
    const C aa = rms ? C(0) : canonical_sum_ref<C>(gw.data(), n, 1, v) / C(n);
    for (int64_t i = 0; i < n; ++i) {
      size_t k = size_t(r * n + i);
      out.dx[k] = rms ? (gw[size_t(i)] - xhat[k] * bb) * rstd[size_t(r)]
                      : ((gw[size_t(i)] - aa) - xhat[k] * bb) * rstd[size_t(r)];
    }
  }
  out.dw.resize(size_t(n));
  out.db.resize(size_t(n));
  for (int64_t j = 0; j < n; ++j) {
    out.dw[size_t(j)] = canonical_sum_ref<C>(gxhat.data() + j, m, n, v);
    out.db[size_t(j)] = canonical_sum_ref<C>(g.data() + j, m, n, v);
  }
  return out;
}

}  // namespace tessel::kernels::ref
