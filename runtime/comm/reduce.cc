#include "runtime/comm/reduce.h"

#include <algorithm>
#include <vector>

#include "runtime/comm/tree.h"
#include "runtime/error.h"

namespace tessel::comm {
namespace {

// Elements per block: the level-by-level tree runs over whole blocks so its
// inner loops are plain vectorisable array operations; per element the
// combination order is exactly the tree of tree.h.
constexpr int64_t kBlock = 512;

// The loops of one block, as functions so that __restrict on their
// parameters tells GCC the buffers do not overlap. kLen > 0 fixes the length
// at compile time: full blocks then have constant trip counts, which is what
// GCC's -O2 vectoriser (very-cheap cost model) needs to emit AVX code.
template <int64_t kLen, class T, class Acc, class Combine>
inline void combine_pair(Acc* __restrict s, const T* __restrict x, const T* __restrict y, int64_t len_rt) {
  const int64_t len = kLen > 0 ? kLen : len_rt;
  Combine combine;
  for (int64_t k = 0; k < len; ++k) s[k] = combine(Acc(load(x[k])), Acc(load(y[k])));
}
template <int64_t kLen, class T, class Acc>
inline void widen(Acc* __restrict s, const T* __restrict x, int64_t len_rt) {
  const int64_t len = kLen > 0 ? kLen : len_rt;
  for (int64_t k = 0; k < len; ++k) s[k] = Acc(load(x[k]));
}
template <int64_t kLen, class Acc, class Combine>
inline void combine_into(Acc* __restrict a, const Acc* __restrict c, int64_t len_rt) {
  const int64_t len = kLen > 0 ? kLen : len_rt;
  Combine combine;
  for (int64_t k = 0; k < len; ++k) a[k] = combine(a[k], c[k]);
}
template <int64_t kLen, class T, class Acc>
inline void narrow(T* __restrict o, const Acc* __restrict s, int64_t len_rt) {
  const int64_t len = kLen > 0 ? kLen : len_rt;
  for (int64_t k = 0; k < len; ++k) o[k] = store<T>(s[k]);
}
template <int64_t kLen, class T, class Acc>
inline void narrow_avg(T* __restrict o, const Acc* __restrict s, Acc div, int64_t len_rt) {
  const int64_t len = kLen > 0 ? kLen : len_rt;
  for (int64_t k = 0; k < len; ++k) o[k] = store<T>(s[k] / div);
}

// One block of elements [b, b + len).
template <int64_t kLen, class T, class Acc, class Combine>
inline void reduce_block(const void* const* src, int n, int64_t b, int64_t len, T* o, Acc* scratch, bool avg) {
  const int m = (n + 1) / 2;
  // Level w = 1 reads the sources: s[j] = v[2j] op v[2j+1].
  for (int j = 0; j < m; ++j) {
    Acc* s = scratch + int64_t(j) * kBlock;
    const T* x = static_cast<const T*>(src[2 * j]) + b;
    if (2 * j + 1 < n) {
      combine_pair<kLen, T, Acc, Combine>(s, x, static_cast<const T*>(src[2 * j + 1]) + b, len);
    } else {
      widen<kLen, T, Acc>(s, x, len);
    }
  }
  // Levels w >= 2 of the tree over v are levels w/2 of the same tree over s.
  for (int w = 1; w < m; w *= 2) {
    for (int i = 0; i + w < m; i += 2 * w) {
      combine_into<kLen, Acc, Combine>(scratch + int64_t(i) * kBlock, scratch + int64_t(i + w) * kBlock, len);
    }
  }
  if (avg) {
    narrow_avg<kLen, T, Acc>(o, scratch, Acc(n), len);
  } else {
    narrow<kLen, T, Acc>(o, scratch, len);
  }
}

template <class T, class Acc, class Combine>
void reduce_typed(const void* const* src, int n, int64_t count, void* out, bool avg) {
  const int m = (n + 1) / 2;  // values left after the first tree level
  // Grows once per thread to the largest rank count seen; no allocation per call.
  thread_local std::vector<Acc> scratch_storage;
  if (scratch_storage.size() < size_t(m) * kBlock) scratch_storage.resize(size_t(m) * kBlock);
  Acc* scratch = scratch_storage.data();
  T* o = static_cast<T*>(out);
  int64_t b = 0;
  for (; b + kBlock <= count; b += kBlock) reduce_block<kBlock, T, Acc, Combine>(src, n, b, kBlock, o + b, scratch, avg);
  if (b < count) reduce_block<0, T, Acc, Combine>(src, n, b, count - b, o + b, scratch, avg);
}

template <class T>
void reduce_dispatch(ReduceOp op, const void* const* src, int n, int64_t count, void* out) {
  using Acc = compute_t<T>;
  switch (op) {
    case ReduceOp::Sum: return reduce_typed<T, Acc, TreeSum<Acc>>(src, n, count, out, false);
    case ReduceOp::Avg: return reduce_typed<T, Acc, TreeSum<Acc>>(src, n, count, out, true);
    case ReduceOp::Max: return reduce_typed<T, Acc, TreeMax<Acc>>(src, n, count, out, false);
    case ReduceOp::Min: return reduce_typed<T, Acc, TreeMin<Acc>>(src, n, count, out, false);
  }
}

}  // namespace

void check_reduce_dtype(const std::string& where, DType dtype, ReduceOp op) {
  if (dtype == DType::Bool && (op == ReduceOp::Sum || op == ReduceOp::Avg)) {
    TESSEL_FAIL(where, "{} of bool tensors is not defined (use max for 'any', min for 'all')", reduce_op_name(op));
  }
  if (is_integral(dtype) && op == ReduceOp::Avg) {
    TESSEL_FAIL(where, "avg of {} tensors is not defined (use sum and divide)", dtype_name(dtype));
  }
}

void tree_reduce(DType dtype, ReduceOp op, const void* const* src, int n, int64_t count, void* out) {
  TESSEL_ASSERT(n >= 1);
  if (count <= 0) return;
  switch (dtype) {
    case DType::Bool: {
      // bool as uint8 0/1: max is "any", min is "all".
      TESSEL_ASSERT(op == ReduceOp::Max || op == ReduceOp::Min);
      return reduce_dispatch<uint8_t>(op, src, n, count, out);
    }
    case DType::Int32: return reduce_dispatch<int32_t>(op, src, n, count, out);
    case DType::Int64: return reduce_dispatch<int64_t>(op, src, n, count, out);
    case DType::Float16: return reduce_dispatch<f16>(op, src, n, count, out);
    case DType::BFloat16: return reduce_dispatch<bf16>(op, src, n, count, out);
    case DType::Float32: return reduce_dispatch<float>(op, src, n, count, out);
    case DType::Float64: return reduce_dispatch<double>(op, src, n, count, out);
  }
}

}  // namespace tessel::comm
