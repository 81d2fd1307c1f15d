// CPU indexing kernels: index validation, indexed loads, the segmented
// canonical scatter-adds (kernels/cpu/segment_sum.h) and triangular masks.
#include <algorithm>
#include <type_traits>
#include <utility>
#include <vector>

#include "kernels/cpu/lines.h"
#include "kernels/cpu/loops.h"
#include "kernels/cpu/segment_sum.h"
#include "kernels/elementwise.h"
#include "kernels/indexing.h"

namespace tessel::kernels::cpu {
namespace {

template <class F>
void dispatch_index(DType t, const char* op, F&& f) {
  if (t == DType::Int32) return f(TypeTag<int32_t>{});
  if (t == DType::Int64) return f(TypeTag<int64_t>{});
  TESSEL_FAIL(op, "indices must be int32 or int64, got {}", dtype_name(t));
}

// The checks left in these kernels are on index values (data, which a Meta
// run never sees; the op checks them first with index_bounds, and a kernel
// re-checks each index as it reads it: an index out of range would read or
// write out of bounds). Shapes and dtypes are the op's (autograd/ops/indexing.cc).
[[noreturn]] void throw_bad_index(const char* op, int64_t v, int64_t limit) {
  TESSEL_FAIL(op, "index {} is out of range [0, {})", v, limit);
}

// ---- index_bounds ------------------------------------------------------------------
void index_bounds_cpu(const Tensor& index, int64_t limit, int64_t* bad_pos, int64_t* bad_value) {
  *bad_pos = -1;
  *bad_value = 0;
  const int64_t n = index.numel();
  if (n == 0) return;
  Tensor idx = index;
  if (!index.is_contiguous()) {
    idx = raw::empty(index.shape(), index.dtype(), index.device());
    copy(index.device(), index, idx);
  }
  dispatch_index(idx.dtype(), "index_bounds", [&](auto tag) {
    using I = typename decltype(tag)::type;
    const I* p = idx.data<I>();
    constexpr int64_t kBlock = 1 << 16;
    const int64_t blocks = (n + kBlock - 1) / kBlock;
    std::vector<int64_t> first(size_t(blocks), -1);  // first bad position per block
    parallel_for(blocks, 1, [&](int64_t b, int64_t e) {
      for (int64_t blk = b; blk < e; ++blk) {
        const int64_t lo = blk * kBlock, hi = std::min(n, lo + kBlock);
        for (int64_t i = lo; i < hi; ++i) {
          const int64_t v = int64_t(p[i]);
          if (v < 0 || v >= limit) {
            first[size_t(blk)] = i;
            break;
          }
        }
      }
    });
    for (int64_t blk = 0; blk < blocks; ++blk) {
      if (first[size_t(blk)] >= 0) {
        *bad_pos = first[size_t(blk)];
        *bad_value = int64_t(p[*bad_pos]);
        return;
      }
    }
  });
}

// ---- gather_strided ------------------------------------------------------------------
void gather_strided_cpu(const Tensor& src, const Tensor& index, int64_t step, int64_t limit, const Tensor& out) {
  dispatch_all(out.dtype(), "gather", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index(index.dtype(), "gather", [&](auto itag) {
      using I = typename decltype(itag)::type;
      strided_loop<3>({&out, &index, &src}, kElementwiseGrain, [&](int64_t n, char* const* p, const int64_t* s) {
        T* o = reinterpret_cast<T*>(p[0]);
        const I* ix = reinterpret_cast<const I*>(p[1]);
        const T* x = reinterpret_cast<const T*>(p[2]);
        const int64_t so = s[0] / int64_t(sizeof(T)), si = s[1] / int64_t(sizeof(I)), sx = s[2] / int64_t(sizeof(T));
        if (si == 0) {  // one index for the whole run (an embedding row, an index_select slice)
          const int64_t v = int64_t(*ix);
          if (TESSEL_UNLIKELY(v < 0 || v >= limit)) throw_bad_index("gather", v, limit);
          const T* row = x + v * step;
          if (so == 1 && sx == 1) {
            std::copy(row, row + n, o);
          } else {
            for (int64_t i = 0; i < n; ++i) o[i * so] = row[i * sx];
          }
          return;
        }
        for (int64_t i = 0; i < n; ++i) {
          const int64_t v = int64_t(ix[i * si]);
          if (TESSEL_UNLIKELY(v < 0 || v >= limit)) throw_bad_index("gather", v, limit);
          o[i * so] = x[i * sx + v * step];
        }
      });
    });
  });
}

// ---- index_add (row-segmented) ---------------------------------------------------------
void index_add_cpu(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, int chunks,
                   bool accumulate) {
  const int d = wrap_dim(dim, out.dim(), "index_add");
  const int64_t Tn = index.numel();
  int64_t O = 1, I = 1;
  for (int e = 0; e < d; ++e) O *= out.shape()[e];
  for (int e = d + 1; e < out.dim(); ++e) I *= out.shape()[e];
  const int64_t R = out.shape()[d];
  const int64_t is = index.dim() == 1 ? index.strides()[0] : 1;
  dispatch_numeric(out.dtype(), "index_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    dispatch_index(index.dtype(), "index_add", [&](auto itag) {
      using Ix = typename decltype(itag)::type;
      segment_sum_rows<T, Ix>(static_cast<const Ix*>(index.raw_data()), is, Tn, R, O, I,
                              static_cast<const T*>(src.raw_data()), static_cast<T*>(out.raw_data()), chunks,
                              accumulate, "index_add");
    });
  });
}

// ---- scatter_add (element-segmented) ---------------------------------------------------
void scatter_add_cpu(const Tensor& out, int64_t dim, const Tensor& index, const Tensor& src, int chunks,
                     bool accumulate) {
  const int d = wrap_dim(dim, out.dim(), "scatter_add");
  if (!accumulate) fill(out.device(), out, Scalar(0));
  if (index.numel() == 0) return;
  const int64_t Tn = index.shape()[d], R = out.shape()[d];
  const int64_t si = index.strides()[d], ss = src.strides()[d], so = out.strides()[d];
  const Lines<3> lines(index.shape(), d, {&index.strides(), &src.strides(), &out.strides()});
  dispatch_numeric(out.dtype(), "scatter_add", [&](auto tag) {
    using T = typename decltype(tag)::type;
    using Acc = segment_acc_t<T>;
    dispatch_index(index.dtype(), "scatter_add", [&](auto itag) {
      using Ix = typename decltype(itag)::type;
      const Ix* ib = static_cast<const Ix*>(index.raw_data());
      const T* sb = static_cast<const T*>(src.raw_data());
      T* ob = static_cast<T*>(out.raw_data());
      const int64_t chunk_rows = std::min<int64_t>(chunks, Tn);
      parallel_for(lines.count, std::max<int64_t>(1, 4096 / Tn), [&](int64_t b, int64_t e) {
        std::vector<std::pair<int64_t, int64_t>> pairs(static_cast<size_t>(Tn));  // (destination, t)
        std::vector<int64_t> pos(static_cast<size_t>(Tn));
        std::vector<Acc> scratch(size_t(numerics::kLanes + chunk_rows));
        for (int64_t line = b; line < e; ++line) {
          int64_t off[3];
          lines.offsets(line, off);
          const Ix* ip = ib + off[0];
          const T* sp = sb + off[1];
          T* op = ob + off[2];
          for (int64_t t = 0; t < Tn; ++t) {
            const int64_t v = int64_t(ip[t * si]);
            if (TESSEL_UNLIKELY(v < 0 || v >= R)) throw_bad_index("scatter_add", v, R);
            pairs[size_t(t)] = {v, t};
          }
          std::sort(pairs.begin(), pairs.end());  // (destination, t) pairs are distinct: one order only
          for (int64_t k = 0; k < Tn; ++k) pos[size_t(k)] = pairs[size_t(k)].second;
          for (int64_t k = 0; k < Tn;) {
            const int64_t r = pairs[size_t(k)].first;
            int64_t end = k + 1;
            while (end < Tn && pairs[size_t(end)].first == r) ++end;
            const Acc* s = segment_sum_one<Acc>(pos.data() + k, end - k, Tn, chunks, 1, scratch.data(),
                                                scratch.data() + numerics::kLanes,
                                                [&](int64_t t, Acc* lane) { lane[0] += Acc(load(sp[t * ss])); });
            segment_store(op + r * so, s[0], accumulate);
            k = end;
          }
        }
      });
    });
  });
}

// ---- triangle -----------------------------------------------------------------------------
void triangle_cpu(const Tensor& x, int64_t k, bool upper, const Tensor& out) {
  const char* name = upper ? "triu" : "tril";
  if (x.numel() == 0) return;
  const int nd = x.dim();
  const int64_t cols = x.shape()[nd - 1];
  const int64_t xs = x.strides()[nd - 1], os = out.strides()[nd - 1];
  const Lines<2> lines(x.shape(), nd - 1, {&x.strides(), &out.strides()});
  dispatch_all(x.dtype(), name, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* xb = static_cast<const T*>(x.raw_data());
    T* ob = static_cast<T*>(out.raw_data());
    parallel_for(lines.count, std::max<int64_t>(1, kElementwiseGrain / cols), [&](int64_t b, int64_t e) {
      for (int64_t line = b; line < e; ++line) {
        int64_t off[2];
        lines.offsets(line, off);
        const int64_t i = lines.coordinate(line, nd - 2);
        // Columns kept: j >= i + k (upper) or j <= i + k (lower).
        const int64_t edge = i + k;
        const T* xr = xb + off[0];
        T* orow = ob + off[1];
        for (int64_t j = 0; j < cols; ++j) {
          const bool keep = upper ? j >= edge : j <= edge;
          orow[j * os] = keep ? xr[j * xs] : T(0);
        }
      }
    });
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(index_bounds, DeviceType::CPU, index_bounds_cpu);
TESSEL_REGISTER_KERNEL(gather_strided, DeviceType::CPU, gather_strided_cpu);
TESSEL_REGISTER_KERNEL(index_add, DeviceType::CPU, index_add_cpu);
TESSEL_REGISTER_KERNEL(scatter_add, DeviceType::CPU, scatter_add_cpu);
TESSEL_REGISTER_KERNEL(triangle, DeviceType::CPU, triangle_cpu);

}  // namespace tessel::kernels::cpu
