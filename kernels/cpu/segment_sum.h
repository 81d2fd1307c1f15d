#pragma once
// Segmented canonical sums: the deterministic scatter-add behind embedding
// backward, scatter_add, index_add and the backward of gather/index_select.
//
// The problem. T source positions t = 0..T-1 along the indexed dimension (in
// global order), each with a destination dest[t] in [0, R) and a row of D
// values v[t][0..D). For every destination r and column j the result is
//
//   S[r][j] = canonical sum (kernels/canonical.h, V chunks) of the length-T
//             sequence  s_t = (dest[t] == r ? v[t][j] : +0.0),
//
// i.e. position t belongs to chunk c = t / ceil(T/V) and to lane
// (t - c*ceil(T/V)) % 8 of that chunk; each lane starts at +0 and adds its
// positions in ascending t; a chunk is ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7));
// the V chunk values are combined by the balanced tree. Because the order is a
// function of the global position t only, a run that shards the t range at
// chunk boundaries (the token dimension of an embedding, say) computes whole
// subtrees locally and finishes the same tree in its collective: same bits as
// one device, whatever the thread count.
//
// The implementation never walks the T*R dense problem. Positions are grouped
// by destination keeping ascending t (a stable counting sort, or a sort on
// (dest, t)); each destination then walks only its own positions, filling
// only the lanes and chunks they touch, and the lane and chunk trees skip the
// untouched (+0) leaves. Skipping is exact: a value that starts at +0 and only
// ever adds can never be -0 under round-to-nearest (x + y is -0 only when
// both are -0), and +0 + x is bitwise x for every x other than -0. So each
// skipped "+ 0" is an identity, and the result equals the dense reference
// bit for bit (tested against segment_sum_rows_ref / canonical_reduce_ref).
//
// Parallelism is over destinations only: each destination's arithmetic is
// the same whichever thread runs it. Scratch is allocated once per thread
// range, never per element.
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/canonical.h"
#include "runtime/dtype.h"
#include "runtime/error.h"
#include "runtime/numerics.h"
#include "runtime/threadpool.h"

namespace tessel::kernels::cpu {

// Accumulator type of a segmented sum over T: float for 16-bit floats and
// float32, double for float64, int64 for integers (exact, order-free).
template <class T>
using segment_acc_t = std::conditional_t<std::is_integral_v<T>, int64_t, compute_t<T>>;

// Balanced tree over L leaves (L a power of two) given sparsely: the present
// leaves have keys keys[0..m) (ascending, distinct, < L) and rows rows[k] of
// width d; absent leaves are +0. Combines exactly like tree_combine over the
// dense array (left + right at every level), in place; returns the row that
// holds the total. m >= 1.
template <class Acc>
Acc* sparse_tree(int* keys, Acc** rows, int m, int leaves, int64_t d) {
  for (int w = 1; w < leaves && m > 1; w *= 2) {
    int out = 0;
    for (int k = 0; k < m;) {
      const int key = keys[k];
      Acc* row = rows[k];
      if (key % (2 * w) == 0 && k + 1 < m && keys[k + 1] == key + w) {
        const Acc* right = rows[k + 1];
        for (int64_t j = 0; j < d; ++j) row[j] = row[j] + right[j];
        k += 2;
      } else {
        k += 1;  // a lone child: its sibling is +0, the parent is the child itself
      }
      keys[out] = key - key % (2 * w);
      rows[out] = row;
      ++out;
    }
    m = out;
  }
  return rows[0];
}

// The segmented sum of one destination. pos[0..n) are its positions in
// ascending order (n >= 1), all in [0, T). add_row(t, lane) must do
// lane[j] += v[t][j] for j < d. `lanes` has room for 8 rows of d, `chunk_rows`
// for min(V, n) rows of d. Returns the row holding S (inside the scratch).
template <class Acc, class AddRow>
const Acc* segment_sum_one(const int64_t* pos, int64_t n, int64_t T, int V, int64_t d, Acc* lanes, Acc* chunk_rows,
                           AddRow&& add_row) {
  constexpr int kL = numerics::kLanes;
  static_assert(kL == 8, "lane mask below assumes 8 lanes");
  const int64_t cs = numerics::chunk_size(T, V);
  int chunk_keys[kMaxChunks];
  Acc* chunk_ptrs[kMaxChunks];
  int nc = 0;
  int64_t i = 0;
  while (i < n) {
    const int64_t c = pos[i] / cs, cb = c * cs, ce = cb + cs;
    unsigned touched = 0;
    for (; i < n && pos[i] < ce; ++i) {
      const int l = int((pos[i] - cb) % kL);
      Acc* lane = lanes + l * d;
      if (!((touched >> l) & 1u)) {
        for (int64_t j = 0; j < d; ++j) lane[j] = Acc(0);
        touched |= 1u << l;
      }
      add_row(pos[i], lane);
    }
    int keys[kL];
    Acc* rows[kL];
    int m = 0;
    for (int l = 0; l < kL; ++l) {
      if ((touched >> l) & 1u) {
        keys[m] = l;
        rows[m] = lanes + l * d;
        ++m;
      }
    }
    const Acc* total = sparse_tree(keys, rows, m, kL, d);
    Acc* dst = chunk_rows + nc * d;
    for (int64_t j = 0; j < d; ++j) dst[j] = total[j];
    chunk_keys[nc] = int(c);
    chunk_ptrs[nc] = dst;
    ++nc;
  }
  return sparse_tree(chunk_keys, chunk_ptrs, nc, V, d);
}

// Writes S into an output element: out = S (assign) or out = out + S
// (accumulate; rounded once into T).
template <class T, class Acc>
inline void segment_store(T* o, Acc s, bool accumulate) {
  if constexpr (std::is_integral_v<T>) {
    *o = accumulate ? T(int64_t(*o) + s) : T(s);
  } else {
    *o = accumulate ? store<T>(compute_t<T>(load(*o)) + s) : store<T>(s);
  }
}

// Stable counting sort of positions by destination: perm lists the positions
// of destination r in ascending order at [offsets[r], offsets[r+1]). Returns
// the largest group size. `op` names the caller for the (defensive) range error.
template <class Idx>
int64_t group_by_destination(const Idx* dest, int64_t dest_stride, int64_t T, int64_t R, std::vector<int64_t>& offsets,
                             std::vector<int64_t>& perm, const char* op) {
  offsets.assign(size_t(R + 1), 0);
  perm.resize(size_t(T));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t r = int64_t(dest[t * dest_stride]);
    if (TESSEL_UNLIKELY(r < 0 || r >= R))
      TESSEL_FAIL(op, "index {} at position {} is out of range [0, {})", r, t, R);
    ++offsets[size_t(r + 1)];
  }
  int64_t largest = 0;
  for (int64_t r = 0; r < R; ++r) {
    largest = std::max(largest, offsets[size_t(r + 1)]);
    offsets[size_t(r + 1)] += offsets[size_t(r)];
  }
  std::vector<int64_t> next(offsets.begin(), offsets.end() - 1);
  for (int64_t t = 0; t < T; ++t) perm[size_t(next[size_t(dest[t * dest_stride])]++)] = t;
  return largest;
}

// Row-segmented sum (index_add, embedding and index_select backward): one 1-D
// destination list dest[0..T) (element stride dest_stride) shared by O outer
// slices. src is contiguous [O, T, D], out contiguous [O, R, D]:
//   out[o][r][j] (=|+=) S over t of src[o][t][j] where dest[t] == r.
// In assign mode, destinations no position hits are set to 0.
template <class T, class Idx>
void segment_sum_rows(const Idx* dest, int64_t dest_stride, int64_t Tn, int64_t R, int64_t O, int64_t D,
                      const T* src, T* out, int V, bool accumulate, const char* op = "segment_sum") {
  using Acc = segment_acc_t<T>;
  if (O == 0 || R == 0 || D == 0) return;
  std::vector<int64_t> offsets, perm;
  const int64_t largest = group_by_destination(dest, dest_stride, Tn, R, offsets, perm, op);
  const int64_t chunk_rows = std::max<int64_t>(1, std::min<int64_t>(V, largest));
  const int64_t grain = std::max<int64_t>(1, 8192 / D);
  parallel_for(O * R, grain, [&](int64_t b, int64_t e) {
    std::vector<Acc> scratch(size_t((numerics::kLanes + chunk_rows) * D));
    Acc* lanes = scratch.data();
    Acc* chunks = lanes + numerics::kLanes * D;
    for (int64_t task = b; task < e; ++task) {
      const int64_t o = task / R, r = task % R;
      T* orow = out + (o * R + r) * D;
      const int64_t n = offsets[size_t(r + 1)] - offsets[size_t(r)];
      if (n == 0) {
        if (!accumulate)
          for (int64_t j = 0; j < D; ++j) orow[j] = T(0);
        continue;
      }
      const T* sbase = src + o * Tn * D;
      const Acc* s = segment_sum_one<Acc>(perm.data() + offsets[size_t(r)], n, Tn, V, D, lanes, chunks,
                                          [&](int64_t t, Acc* lane) {
                                            const T* srow = sbase + t * D;
                                            for (int64_t j = 0; j < D; ++j) lane[j] += Acc(load(srow[j]));
                                          });
      for (int64_t j = 0; j < D; ++j) segment_store(orow + j, s[j], accumulate);
    }
  });
}

// The scalar reference of segment_sum_rows: for every output element, the
// dense canonical reduction of the length-T sequence with +0 at positions
// that do not hit it (O(R*T*D); tests only).
template <class T, class Idx>
void segment_sum_rows_ref(const Idx* dest, int64_t dest_stride, int64_t Tn, int64_t R, int64_t O, int64_t D,
                          const T* src, T* out, int V, bool accumulate) {
  using Acc = segment_acc_t<T>;
  for (int64_t o = 0; o < O; ++o)
    for (int64_t r = 0; r < R; ++r) {
      bool hit = false;
      for (int64_t t = 0; t < Tn; ++t) hit = hit || int64_t(dest[t * dest_stride]) == r;
      for (int64_t j = 0; j < D; ++j) {
        T* o_el = out + (o * R + r) * D + j;
        if (!hit) {
          if (!accumulate) *o_el = T(0);
          continue;
        }
        Acc s = canonical_reduce_ref<Acc>(
            Tn, V, Acc(0),
            [&](int64_t t) {
              return int64_t(dest[t * dest_stride]) == r ? Acc(load(src[(o * Tn + t) * D + j])) : Acc(0);
            },
            SumCombine<Acc>());
        segment_store(o_el, s, accumulate);
      }
    }
}

}  // namespace tessel::kernels::cpu
