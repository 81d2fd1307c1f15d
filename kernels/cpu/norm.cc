// CPU LayerNorm / RMSNorm (order of operations: kernels/norm.h).
//
// Forward and dx: parallel over rows, each row summed with the canonical row
// sum over a per-task scratch row (allocated once per parallel range).
// dweight/dbias: canonical column sums (kernels/cpu/row_ops.h), parallel over
// (chunk, column block), with the summands computed on the fly by the same
// expressions as the row pass.
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/row_ops.h"
#include "kernels/norm.h"

namespace tessel::kernels::cpu {
namespace {

template <class C, class T>
std::vector<C> to_compute(const Tensor& t) {
  std::vector<C> out;
  if (!t.defined()) return out;
  const T* p = static_cast<const T*>(t.raw_data());
  out.resize(size_t(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = C(load(p[i]));
  return out;
}

template <class T, class C>
void store_vec(const std::vector<C>& src, const Tensor& dst) {
  T* p = static_cast<T*>(dst.raw_data());
  for (size_t i = 0; i < src.size(); ++i) p[i] = store<T>(src[i]);
}

template <class T, bool kRms>
void norm_forward_typed(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                        const Tensor& mean, const Tensor& rstd, int v) {
  using C = compute_t<T>;
  const int64_t m = x.shape()[0], n = x.shape()[1];
  const std::vector<C> wc = to_compute<C, T>(w), bc = to_compute<C, T>(b);
  const bool has_w = !wc.empty(), has_b = !bc.empty();
  const C eps_c = C(eps), n_c = C(n);
  const T* xb = static_cast<const T*>(x.raw_data());
  T* yb = static_cast<T*>(y.raw_data());
  C* mean_p = kRms ? nullptr : static_cast<C*>(mean.raw_data());
  C* rstd_p = static_cast<C*>(rstd.raw_data());
  parallel_for(m, row_grain(n), [&](int64_t rb, int64_t re) {
    std::vector<C> scratch(size_t(2 * n));
    for (int64_t r = rb; r < re; ++r) {
      const C* xc = row_as_compute<C>(xb + r * n, n, 1, scratch.data());
      C* q = scratch.data() + n;
      T* yr = yb + r * n;
      C mu = C(0);
      if constexpr (kRms) {
        for (int64_t i = 0; i < n; ++i) q[i] = xc[i] * xc[i];
      } else {
        mu = row_sum(xc, n, v) / n_c;
        for (int64_t i = 0; i < n; ++i) q[i] = (xc[i] - mu) * (xc[i] - mu);
      }
      const C rs = C(1) / std::sqrt(row_sum(q, n, v) / n_c + eps_c);
      if constexpr (kRms) {
        if (has_w) for (int64_t i = 0; i < n; ++i) yr[i] = store<T>((xc[i] * rs) * wc[size_t(i)]);
        else for (int64_t i = 0; i < n; ++i) yr[i] = store<T>(xc[i] * rs);
      } else {
        if (has_w && has_b) for (int64_t i = 0; i < n; ++i) yr[i] = store<T>(((xc[i] - mu) * rs) * wc[size_t(i)] + bc[size_t(i)]);
        else if (has_w) for (int64_t i = 0; i < n; ++i) yr[i] = store<T>(((xc[i] - mu) * rs) * wc[size_t(i)]);
        else if (has_b) for (int64_t i = 0; i < n; ++i) yr[i] = store<T>((xc[i] - mu) * rs + bc[size_t(i)]);
        else for (int64_t i = 0; i < n; ++i) yr[i] = store<T>((xc[i] - mu) * rs);
        mean_p[r] = mu;
      }
      rstd_p[r] = rs;
    }
  });
}

template <class T, bool kRms>
void norm_backward_typed(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& mean, const Tensor& rstd,
                         const Tensor& dx, const Tensor& dw, const Tensor& db, int v) {
  using C = compute_t<T>;
  const int64_t m = x.shape()[0], n = x.shape()[1];
  const std::vector<C> wc = to_compute<C, T>(w);
  const bool has_w = !wc.empty();
  const C n_c = C(n);
  const T* xb = static_cast<const T*>(x.raw_data());
  const T* gb = static_cast<const T*>(g.raw_data());
  const C* mean_p = kRms ? nullptr : static_cast<const C*>(mean.raw_data());
  const C* rstd_p = static_cast<const C*>(rstd.raw_data());
  auto xhat = [&](int64_t t, int64_t j) -> C {
    if constexpr (kRms) return C(load(xb[t * n + j])) * rstd_p[t];
    else return (C(load(xb[t * n + j])) - mean_p[t]) * rstd_p[t];
  };

  if (dx.defined()) {
    T* dxb = static_cast<T*>(dx.raw_data());
    parallel_for(m, row_grain(n), [&](int64_t rb, int64_t re) {
      std::vector<C> scratch(size_t(2 * n));
      C* gw = scratch.data();
      C* p = scratch.data() + n;
      for (int64_t r = rb; r < re; ++r) {
        const T* gr = gb + r * n;
        T* dr = dxb + r * n;
        const C rs = rstd_p[r];
        if (has_w) for (int64_t i = 0; i < n; ++i) gw[i] = C(load(gr[i])) * wc[size_t(i)];
        else for (int64_t i = 0; i < n; ++i) gw[i] = C(load(gr[i]));
        for (int64_t i = 0; i < n; ++i) p[i] = gw[i] * xhat(r, i);
        const C bb = row_sum(p, n, v) / n_c;
        if constexpr (kRms) {
          for (int64_t i = 0; i < n; ++i) dr[i] = store<T>((gw[i] - xhat(r, i) * bb) * rs);
        } else {
          const C aa = row_sum(gw, n, v) / n_c;
          for (int64_t i = 0; i < n; ++i) dr[i] = store<T>(((gw[i] - aa) - xhat(r, i) * bb) * rs);
        }
      }
    });
  }

  if (dw.defined() || db.defined()) {
    std::vector<C> dwc(static_cast<size_t>(n)), dbc(dwc.size());
    canonical_col_sums<C, 2>(
        m, n, v,
        [&](int64_t t, int64_t j0, int64_t width, C* const* dst) {
          const T* gr = gb + t * n + j0;
          for (int64_t i = 0; i < width; ++i) {
            const C gv = C(load(gr[i]));
            dst[0][i] = gv * xhat(t, j0 + i);
            dst[1][i] = gv;
          }
        },
        {dwc.data(), dbc.data()});
    if (dw.defined()) store_vec<T>(dwc, dw);
    if (db.defined()) store_vec<T>(dbc, db);
  }
}

void layer_norm_forward_cpu(const Tensor& x, const Tensor& w, const Tensor& b, double eps, const Tensor& y,
                            const Tensor& mean, const Tensor& rstd, int v) {
  if (x.numel() == 0) return;
  dispatch_floating(x.dtype(), "layer_norm", [&](auto tag) {
    norm_forward_typed<typename decltype(tag)::type, false>(x, w, b, eps, y, mean, rstd, v);
  });
}

void layer_norm_backward_cpu(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& mean,
                             const Tensor& rstd, const Tensor& dx, const Tensor& dw, const Tensor& db, int v) {
  if (x.shape()[1] == 0) return;
  if (x.shape()[0] == 0) {  // empty sums: zero weight/bias gradients
    for (const Tensor* t : {&dw, &db})
      if (t->defined()) std::memset(t->raw_data(), 0, t->nbytes());
    return;
  }
  dispatch_floating(x.dtype(), "layer_norm_backward", [&](auto tag) {
    norm_backward_typed<typename decltype(tag)::type, false>(g, x, w, mean, rstd, dx, dw, db, v);
  });
}

void rms_norm_forward_cpu(const Tensor& x, const Tensor& w, double eps, const Tensor& y, const Tensor& rstd, int v) {
  if (x.numel() == 0) return;
  dispatch_floating(x.dtype(), "rms_norm", [&](auto tag) {
    norm_forward_typed<typename decltype(tag)::type, true>(x, w, Tensor(), eps, y, Tensor(), rstd, v);
  });
}

void rms_norm_backward_cpu(const Tensor& g, const Tensor& x, const Tensor& w, const Tensor& rstd, const Tensor& dx,
                           const Tensor& dw, int v) {
  if (x.shape()[1] == 0) return;
  if (x.shape()[0] == 0) {
    if (dw.defined()) std::memset(dw.raw_data(), 0, dw.nbytes());
    return;
  }
  dispatch_floating(x.dtype(), "rms_norm_backward", [&](auto tag) {
    norm_backward_typed<typename decltype(tag)::type, true>(g, x, w, Tensor(), rstd, dx, dw, Tensor(), v);
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(layer_norm_forward, DeviceType::CPU, layer_norm_forward_cpu);
TESSEL_REGISTER_KERNEL(layer_norm_backward, DeviceType::CPU, layer_norm_backward_cpu);
TESSEL_REGISTER_KERNEL(rms_norm_forward, DeviceType::CPU, rms_norm_forward_cpu);
TESSEL_REGISTER_KERNEL(rms_norm_backward, DeviceType::CPU, rms_norm_backward_cpu);

}  // namespace tessel::kernels::cpu
