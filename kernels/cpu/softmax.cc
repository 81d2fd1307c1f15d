// CPU softmax / log-softmax (order of operations: kernels/softmax.h).
//
// Each row is computed on contiguous compute-type arrays. Float32 rows with a
// unit stride are used in place (the output row doubles as the buffer of exp
// values); other dtypes and strides are gathered into a per-task scratch
// buffer (allocated once per parallel range, never per row) and scattered
// back. Either way a row's arithmetic is the same, so layout and thread count
// never change a bit.
#include <vector>

#include "kernels/cpu/row_ops.h"
#include "kernels/softmax.h"
#include "runtime/tmath.h"

namespace tessel::kernels::cpu {
namespace {

// y may alias e; x must not alias either.
template <class C>
void softmax_row(const C* x, C* y, C* e, int64_t n, int v, bool log) {
  const C m = row_max(x, n);
  for (int64_t i = 0; i < n; ++i) e[i] = tmath::exp(x[i] - m);
  const C s = row_sum(e, n, v);
  if (!log) {
    const C r = C(1) / s;
    for (int64_t i = 0; i < n; ++i) y[i] = e[i] * r;
  } else {
    const C lse = tmath::log(s);
    for (int64_t i = 0; i < n; ++i) y[i] = (x[i] - m) - lse;
  }
}

// p may alias dx; g and y must not alias dx.
template <class C>
void softmax_backward_row(const C* g, const C* y, C* dx, C* p, int64_t n, int v, bool log) {
  if (!log) {
    for (int64_t i = 0; i < n; ++i) p[i] = g[i] * y[i];
    const C d = row_sum(p, n, v);
    for (int64_t i = 0; i < n; ++i) dx[i] = y[i] * (g[i] - d);
  } else {
    const C s = row_sum(g, n, v);
    for (int64_t i = 0; i < n; ++i) dx[i] = g[i] - tmath::exp(y[i]) * s;
  }
}

template <class T>
void store_row(const compute_t<T>* src, T* dst, int64_t n, int64_t stride) {
  for (int64_t i = 0; i < n; ++i) dst[i * stride] = store<T>(src[i]);
}

template <class T>
void softmax_forward_typed(const Tensor& x, int d, bool log, const Tensor& out, int v) {
  using C = compute_t<T>;
  const int64_t n = x.shape()[d], xs = x.strides()[d], os = out.strides()[d];
  RowCursor<2> rows({&x, &out}, d);
  const T* xb = static_cast<const T*>(x.raw_data());
  T* ob = static_cast<T*>(out.raw_data());
  parallel_for(rows.rows(), row_grain(n), [&](int64_t rb, int64_t re) {
    RowCursor<2> cur = rows;
    cur.seek(rb);
    std::vector<C> scratch;
    for (int64_t r = rb; r < re; ++r, cur.next()) {
      const T* xr = xb + cur.offset(0);
      T* orow = ob + cur.offset(1);
      if constexpr (std::is_same_v<T, C>) {
        if (xs == 1 && os == 1) {
          softmax_row<C>(xr, orow, orow, n, v, log);
          continue;
        }
      }
      if (scratch.empty()) scratch.resize(size_t(2 * n));
      const C* xc = row_as_compute<C>(xr, n, xs, scratch.data());
      C* yc = scratch.data() + n;
      softmax_row<C>(xc, yc, yc, n, v, log);
      store_row<T>(yc, orow, n, os);
    }
  });
}

template <class T>
void softmax_backward_typed(const Tensor& g, const Tensor& y, int d, bool log, const Tensor& dx, int v) {
  using C = compute_t<T>;
  const int64_t n = g.shape()[d], gs = g.strides()[d], ys = y.strides()[d], ds = dx.strides()[d];
  RowCursor<3> rows({&g, &y, &dx}, d);
  const T* gb = static_cast<const T*>(g.raw_data());
  const T* yb = static_cast<const T*>(y.raw_data());
  T* db = static_cast<T*>(dx.raw_data());
  parallel_for(rows.rows(), row_grain(n), [&](int64_t rb, int64_t re) {
    RowCursor<3> cur = rows;
    cur.seek(rb);
    std::vector<C> scratch;
    for (int64_t r = rb; r < re; ++r, cur.next()) {
      const T* gr = gb + cur.offset(0);
      const T* yr = yb + cur.offset(1);
      T* dr = db + cur.offset(2);
      if constexpr (std::is_same_v<T, C>) {
        if (gs == 1 && ys == 1 && ds == 1) {
          softmax_backward_row<C>(gr, yr, dr, dr, n, v, log);
          continue;
        }
      }
      if (scratch.empty()) scratch.resize(size_t(3 * n));
      const C* gc = row_as_compute<C>(gr, n, gs, scratch.data());
      const C* yc = row_as_compute<C>(yr, n, ys, scratch.data() + n);
      C* dc = scratch.data() + 2 * n;
      softmax_backward_row<C>(gc, yc, dc, dc, n, v, log);
      store_row<T>(dc, dr, n, ds);
    }
  });
}

void softmax_forward_cpu(const Tensor& x, int64_t dim, bool log, const Tensor& out, int v) {
  const char* op = log ? "log_softmax" : "softmax";
  const int d = wrap_dim(dim, x.dim(), op);
  if (x.numel() == 0) return;
  dispatch_floating(x.dtype(), op, [&](auto tag) { softmax_forward_typed<typename decltype(tag)::type>(x, d, log, out, v); });
}

void softmax_backward_cpu(const Tensor& g, const Tensor& y, int64_t dim, bool log, const Tensor& dx, int v) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  const int d = wrap_dim(dim, y.dim(), op);
  if (y.numel() == 0) return;
  dispatch_floating(y.dtype(), op,
                    [&](auto tag) { softmax_backward_typed<typename decltype(tag)::type>(g, y, d, log, dx, v); });
}

}  // namespace

TESSEL_REGISTER_KERNEL(softmax_forward, DeviceType::CPU, softmax_forward_cpu);
TESSEL_REGISTER_KERNEL(softmax_backward, DeviceType::CPU, softmax_backward_cpu);

}  // namespace tessel::kernels::cpu
