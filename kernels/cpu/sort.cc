// CPU sort and topk: one line at a time, parallel over lines.
//
// Both use a comparator that is a strict *total* order on (value, index):
// values by the order of kernels/sort.h, ties by ascending index. With a
// total order any correct sorting algorithm (std::sort, std::partial_sort)
// yields the same permutation, which is the stable one; no per-line
// allocation is needed (std::stable_sort would allocate).
#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "kernels/cpu/lines.h"
#include "kernels/cpu/loops.h"
#include "kernels/sort.h"

namespace tessel::kernels::cpu {
namespace {

template <class C>
struct AscendingOrder {  // NaN is larger than every number
  const C* v;
  bool operator()(int64_t a, int64_t b) const {
    const C x = v[a], y = v[b];
    const bool xn = x != x, yn = y != y;
    if (xn || yn) return xn && yn ? a < b : yn;
    if (x < y) return true;
    if (y < x) return false;
    return a < b;
  }
};

template <class C>
struct DescendingOrder {  // NaN first
  const C* v;
  bool operator()(int64_t a, int64_t b) const {
    const C x = v[a], y = v[b];
    const bool xn = x != x, yn = y != y;
    if (xn || yn) return xn && yn ? a < b : xn;
    if (x > y) return true;
    if (y > x) return false;
    return a < b;
  }
};

// Runs body(x_line, n, x_stride, values_line, indices_line, vals, idx) for each
// line along dim, with per-range scratch `vals` (compute type) and `idx`.
template <class T, class Body>
void for_each_line(const Tensor& x, int d, const Tensor& values, const Tensor& indices, Body&& body) {
  using C = compute_t<T>;
  const int64_t n = x.shape()[d];
  const Lines<3> lines(x.shape(), d, {&x.strides(), &values.strides(), &indices.strides()});
  const T* xb = static_cast<const T*>(x.raw_data());
  T* vb = static_cast<T*>(values.raw_data());
  int64_t* ib = static_cast<int64_t*>(indices.raw_data());
  const int64_t grain = std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1));
  parallel_for(lines.count, grain, [&](int64_t b, int64_t e) {
    std::unique_ptr<C[]> vals(new C[size_t(n)]);  // not std::vector: C may be bool
    std::unique_ptr<int64_t[]> idx(new int64_t[size_t(n)]);
    for (int64_t line = b; line < e; ++line) {
      int64_t off[3];
      lines.offsets(line, off);
      const T* xl = xb + off[0];
      const int64_t xs = x.strides()[d];
      for (int64_t t = 0; t < n; ++t) vals[size_t(t)] = load(xl[t * xs]);
      std::iota(idx.get(), idx.get() + n, int64_t(0));
      body(xl, xs, vb + off[1], ib + off[2], vals.get(), idx.get());
    }
  });
}

void sort_cpu(const Tensor& x, int64_t dim, bool descending, const Tensor& values, const Tensor& indices) {
  const int d = wrap_dim(dim, x.dim(), "sort");
  if (x.numel() == 0) return;
  const int64_t n = x.shape()[d];
  const int64_t vs = values.strides()[d], is = indices.strides()[d];
  dispatch_all(x.dtype(), "sort", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    for_each_line<T>(x, d, values, indices,
                     [&](const T* xl, int64_t xs, T* vl, int64_t* il, const C* vals, int64_t* idx) {
                       if (descending) std::sort(idx, idx + n, DescendingOrder<C>{vals});
                       else std::sort(idx, idx + n, AscendingOrder<C>{vals});
                       for (int64_t j = 0; j < n; ++j) {
                         vl[j * vs] = xl[idx[j] * xs];  // the original element, bits untouched
                         il[j * is] = idx[j];
                       }
                     });
  });
}

void topk_cpu(const Tensor& x, int64_t k, int64_t dim, bool largest, bool sorted, const Tensor& values,
              const Tensor& indices) {
  const int d = wrap_dim(dim, x.dim(), "topk");
  const int64_t n = x.shape()[d];
  if (values.numel() == 0) return;
  const int64_t vs = values.strides()[d], is = indices.strides()[d];
  dispatch_all(x.dtype(), "topk", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    for_each_line<T>(x, d, values, indices,
                     [&](const T* xl, int64_t xs, T* vl, int64_t* il, const C* vals, int64_t* idx) {
                       if (largest) std::partial_sort(idx, idx + k, idx + n, DescendingOrder<C>{vals});
                       else std::partial_sort(idx, idx + k, idx + n, AscendingOrder<C>{vals});
                       if (!sorted) std::sort(idx, idx + k);
                       for (int64_t j = 0; j < k; ++j) {
                         vl[j * vs] = xl[idx[j] * xs];
                         il[j * is] = idx[j];
                       }
                     });
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(sort, DeviceType::CPU, sort_cpu);
TESSEL_REGISTER_KERNEL(topk, DeviceType::CPU, topk_cpu);

}  // namespace tessel::kernels::cpu
