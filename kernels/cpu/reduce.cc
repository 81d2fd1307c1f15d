// CPU reductions in the canonical order (kernels/canonical.h).
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "kernels/canonical.h"
#include "kernels/cpu/canonical_simd.h"
#include "kernels/cpu/loops.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace tessel::kernels::cpu {
namespace {

// The reduction as a 2-D problem: for each kept position, `r` elements at
// stride `r_stride` (elements) from a base that walks the kept dims.
struct ReducePlan {
  Tensor x_kept;   // view of x over the kept dims (reduced dims dropped), base of each run
  Tensor out_kept; // out over the same kept dims
  int64_t r = 1;
  int64_t r_stride = 1;
  Tensor holder;   // keeps a contiguous copy alive when one was needed
};

ReducePlan plan_reduction(const Tensor& x, const Tensor& out) {
  const int nd = x.dim();
  Dims kept_shape, kept_x_strides, kept_out_strides, red_shape, red_strides;
  for (int d = 0; d < nd; ++d) {
    bool reduced = out.shape()[d] == 1 && x.shape()[d] != 1;
    if (reduced) {
      red_shape.push_back(x.shape()[d]);
      red_strides.push_back(x.strides()[d]);
    } else if (x.shape()[d] != 1) {
      kept_shape.push_back(x.shape()[d]);
      kept_x_strides.push_back(x.strides()[d]);
      kept_out_strides.push_back(out.strides()[d]);
    }
  }
  ReducePlan p;
  p.r = numel_of(red_shape);
  // Can the reduced dims be walked with one stride (row-major over them)?
  bool single = true;
  for (int i = 0; i + 1 < red_shape.size(); ++i)
    single = single && red_strides[i] == red_strides[i + 1] * red_shape[i + 1];
  if (single) {
    p.r_stride = red_shape.empty() ? 1 : red_strides.back();
    p.x_kept = raw::as_strided(x, kept_shape, kept_x_strides, x.offset());
  } else {
    // Materialise x as [kept..., reduced...] contiguous.
    Dims perm_shape = kept_shape, perm_strides = kept_x_strides;
    for (int i = 0; i < red_shape.size(); ++i) {
      perm_shape.push_back(red_shape[i]);
      perm_strides.push_back(red_strides[i]);
    }
    Tensor permuted = raw::as_strided(x, perm_shape, perm_strides, x.offset());
    p.holder = raw::empty(perm_shape, x.dtype(), x.device());
    copy(x.device(), permuted, p.holder);
    p.r_stride = 1;
    Dims ks = contiguous_strides(kept_shape);
    for (auto& st : ks) st *= p.r;
    p.x_kept = raw::as_strided(p.holder, kept_shape, ks, 0);
  }
  p.out_kept = raw::as_strided(out, kept_shape, kept_out_strides, out.offset());
  return p;
}

template <class Acc, class T, class Combine>
Acc reduce_strided_ref(const T* x, int64_t n, int64_t stride, int v, Acc identity, Combine combine) {
  return canonical_reduce_ref<Acc>(
      n, v, identity, [&](int64_t t) { return static_cast<Acc>(load(x[t * stride])); }, combine);
}

// Floating-point sum/max/min.
template <class T, ReduceOp Op>
void reduce_float(const ReducePlan& p, int v) {
  using Acc = compute_t<T>;
  auto combine = [](Acc a, Acc b) -> Acc {
    if constexpr (Op == ReduceOp::Sum) return a + b;
    else if constexpr (Op == ReduceOp::Max) return MaxCombine<Acc>()(a, b);
    else return MinCombine<Acc>()(a, b);
  };
  const Acc identity = Op == ReduceOp::Sum   ? Acc(0)
                       : Op == ReduceOp::Max ? -std::numeric_limits<Acc>::infinity()
                                             : std::numeric_limits<Acc>::infinity();
  const int64_t r = p.r, rs = p.r_stride;
  constexpr bool kSimdSum = std::is_same_v<T, float> && Op == ReduceOp::Sum;

  if (p.out_kept.numel() == 1 && r >= 2 * kElementwiseGrain) {
    // One long reduction: chunks in parallel, then the tree.
    const T* x = static_cast<const T*>(p.x_kept.raw_data());
    std::vector<Acc> vals(size_t(v), identity);
    parallel_for(v, 1, [&](int64_t cb, int64_t ce) {
      for (int64_t c = cb; c < ce; ++c) {
        int64_t b = numerics::chunk_begin(r, v, int(c)), e = numerics::chunk_end(r, v, int(c));
        if constexpr (kSimdSum) {
          if (rs == 1) {
            vals[size_t(c)] = chunk_sum_row(x + b, e - b);
            continue;
          }
        }
        vals[size_t(c)] = chunk_reduce_ref<Acc>(
            b, e, identity, [&](int64_t t) { return static_cast<Acc>(load(x[t * rs])); }, combine);
      }
    });
    T* o = static_cast<T*>(p.out_kept.raw_data());
    *o = store<T>(tree_combine(vals.data(), v, combine));
    return;
  }

  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(r, 1));
  strided_loop<2>({&p.out_kept, &p.x_kept}, grain, [&](int64_t n, char* const* ptr, const int64_t* s) {
    T* o = reinterpret_cast<T*>(ptr[0]);
    const T* x = reinterpret_cast<const T*>(ptr[1]);
    const int64_t so = s[0] / int64_t(sizeof(T)), sx = s[1] / int64_t(sizeof(T));
    if constexpr (kSimdSum) {
      if (rs == 1) {
        for (int64_t i = 0; i < n; ++i) o[i * so] = canonical_sum_row(x + i * sx, r, v);
        return;
      }
      if (sx == 1 && so == 1) {
        canonical_sum_cols(x, r, rs, n, v, o);
        return;
      }
    }
    for (int64_t i = 0; i < n; ++i) o[i * so] = store<T>(reduce_strided_ref<Acc>(x + i * sx, r, rs, v, identity, combine));
  });
}

// Integer and bool sums (exact in int64) and integer max/min.
template <class T, ReduceOp Op>
void reduce_int(const ReducePlan& p) {
  using Out = std::conditional_t<Op == ReduceOp::Sum, int64_t, T>;
  const int64_t r = p.r, rs = p.r_stride;
  const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(r, 1));
  strided_loop<2>({&p.out_kept, &p.x_kept}, grain, [&](int64_t n, char* const* ptr, const int64_t* s) {
    Out* o = reinterpret_cast<Out*>(ptr[0]);
    const T* x = reinterpret_cast<const T*>(ptr[1]);
    const int64_t so = s[0] / int64_t(sizeof(Out)), sx = s[1] / int64_t(sizeof(T));
    for (int64_t i = 0; i < n; ++i) {
      const T* xi = x + i * sx;
      if constexpr (Op == ReduceOp::Sum) {
        int64_t acc = 0;
        for (int64_t t = 0; t < r; ++t) acc += int64_t(xi[t * rs]);
        o[i * so] = acc;
      } else {
        T acc = xi[0];
        for (int64_t t = 1; t < r; ++t) {
          T val = xi[t * rs];
          if constexpr (Op == ReduceOp::Max) acc = val > acc ? val : acc;
          else acc = val < acc ? val : acc;
        }
        o[i * so] = acc;
      }
    }
  });
}

void reduce_cpu(ReduceOp op, const Tensor& x, const Tensor& out, int v) {
  if (out.numel() == 0) return;
  if (x.numel() == 0) {  // empty reduction: the identity (sum only; max/min are rejected by the op layer)
    fill(out.device(), out, Scalar(0));
    return;
  }
  ReducePlan p = plan_reduction(x, out);
  dispatch_all(x.dtype(), "reduce", [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, f16> || std::is_same_v<T, bf16>) {
      switch (op) {
        case ReduceOp::Sum: return reduce_float<T, ReduceOp::Sum>(p, v);
        case ReduceOp::Max: return reduce_float<T, ReduceOp::Max>(p, v);
        case ReduceOp::Min: return reduce_float<T, ReduceOp::Min>(p, v);
      }
    } else {
      switch (op) {
        case ReduceOp::Sum: return reduce_int<T, ReduceOp::Sum>(p);
        case ReduceOp::Max: return reduce_int<T, ReduceOp::Max>(p);
        case ReduceOp::Min: return reduce_int<T, ReduceOp::Min>(p);
      }
    }
  });
}

void arg_reduce_cpu(const Tensor& x, int64_t dim, bool is_max, const Tensor& out) {
  const int d = wrap_dim(dim, x.dim(), is_max ? "argmax" : "argmin");
  const int64_t n = x.shape()[d], xs = x.strides()[d];
  Dims kshape = x.shape(), kstr = x.strides();
  kshape[d] = 1;
  Tensor xk = raw::as_strided(x, kshape, kstr, x.offset());
  dispatch_all(x.dtype(), is_max ? "argmax" : "argmin", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using C = compute_t<T>;
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(n, 1));
    strided_loop<2>({&out, &xk}, grain, [&](int64_t cnt, char* const* ptr, const int64_t* s) {
      int64_t* o = reinterpret_cast<int64_t*>(ptr[0]);
      const T* base = reinterpret_cast<const T*>(ptr[1]);
      const int64_t so = s[0] / 8, sx = s[1] / int64_t(sizeof(T));
      for (int64_t i = 0; i < cnt; ++i) {
        const T* xi = base + i * sx;
        int64_t best = 0;
        C bv = static_cast<C>(load(xi[0]));
        for (int64_t t = 1; t < n && !(bv != bv); ++t) {
          C val = static_cast<C>(load(xi[t * xs]));
          if (val != val || (is_max ? val > bv : val < bv)) {
            bv = val;
            best = t;
          }
        }
        o[i * so] = best;
      }
    });
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(reduce, DeviceType::CPU, reduce_cpu);
TESSEL_REGISTER_KERNEL(arg_reduce, DeviceType::CPU, arg_reduce_cpu);

}  // namespace tessel::kernels::cpu
