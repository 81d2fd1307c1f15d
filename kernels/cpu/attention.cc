// CPU fused causal attention (order of operations: kernels/attention.h;
// scalar reference: kernels/cpu/attention_ref.h).
//
// float32 / float16 / bfloat16 (compute in float) take the AVX2 path below;
// float64 (gradient checks) runs the reference loops.
//
// Layout of the work. Operands are packed per task into float scratch (any
// input strides and dtypes; allocated once per parallel range, never per row):
// K/V as 16-key panels (d-major) for the score tiles, V/K/Q/dO as rows padded
// to a multiple of 16 columns for the weighted sums.
//   forward, backward pass 1: a task is (b, kv head, block of 48 queries) and
//     walks the g query heads of the kv head; per head it computes the block's
//     scores (and dP) for keys j <= i only, the row statistics, then the
//     weighted sum over keys (out, or dQ).
//   backward pass 2: a task is (b, kv head, block of 48 keys); per query head
//     it recomputes scores and dP for queries i >= j, then dK and dV as sums
//     over queries, and finally the canonical sum over the group's heads.
// Pass 1 also leaves Dl (the softmax-backward row sum) for pass 2.
//
// Why the results never depend on tiles or threads: every score is one FMA
// chain over d (the tile only decides which lanes compute it), row statistics
// are computed per row, and every weighted sum runs the same chunk-by-chunk
// FMA chains and the same tree (a binary counter over chunk indices of the
// global length) whatever tile it sits in; rows of a tile that have no term
// in a chunk push a +0 leaf, which is exactly the definition. Padded tile rows
// and columns are computed from zeros and never stored.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <vector>

#include "kernels/attention.h"
#include "kernels/cpu/attention_ref.h"
#include "kernels/cpu/canonical_simd.h"
#include "runtime/dtype.h"
#include "runtime/numerics.h"
#include "runtime/threadpool.h"
#include "runtime/tmath.h"

namespace tessel::kernels::cpu {
namespace {

constexpr int MR = 6;             // tile rows (queries for scores/out/dQ, keys for dK/dV)
constexpr int NR = 16;            // tile columns: 2 x 8 floats (keys for scores, head_dim for sums)
constexpr int64_t kBlock = 48;    // queries (forward, pass 1) or keys (pass 2) per task; multiple of MR and NR

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
int64_t ceil_div(int64_t x, int64_t m) { return (x + m - 1) / m; }
int log2_int(int v) {
  int l = 0;
  while ((1 << l) < v) ++l;
  return l;
}

// A [B, H, T, D] operand with any strides.
template <class T>
struct Operand {
  const T* data;
  int64_t sb, sh, st, sd;
  const T* row(int64_t b, int64_t h, int64_t t) const { return data + b * sb + h * sh + t * st; }
};
template <class T>
Operand<T> operand(const Tensor& x) {
  return {static_cast<const T*>(x.raw_data()), x.strides()[0], x.strides()[1], x.strides()[2], x.strides()[3]};
}

// Rows t0..t1 of one head as floats, `ld` columns each (zeros after D).
template <class T>
void pack_rows(const Operand<T>& x, int64_t b, int64_t h, int64_t t0, int64_t t1, int64_t D, int64_t ld, float* dst) {
  for (int64_t t = t0; t < t1; ++t) {
    const T* src = x.row(b, h, t);
    float* o = dst + (t - t0) * ld;
    if (x.sd == 1) {
      for (int64_t d = 0; d < D; ++d) o[d] = float(load(src[d]));
    } else {
      for (int64_t d = 0; d < D; ++d) o[d] = float(load(src[d * x.sd]));
    }
    for (int64_t d = D; d < ld; ++d) o[d] = 0.0f;
  }
}

// Rows t0..t1 as W-row panels, d-major: dst[p][d][w] = row t0 + p*W + w (zeros past t1).
template <int W, class T>
void pack_panels(const Operand<T>& x, int64_t b, int64_t h, int64_t t0, int64_t t1, int64_t D, float* dst) {
  const int64_t np = ceil_div(t1 - t0, W);
  for (int64_t p = 0; p < np; ++p)
    for (int w = 0; w < W; ++w) {
      const int64_t t = t0 + p * W + w;
      float* o = dst + p * D * W + w;
      if (t < t1) {
        const T* src = x.row(b, h, t);
        for (int64_t d = 0; d < D; ++d) o[d * W] = float(load(src[d * x.sd]));
      } else {
        for (int64_t d = 0; d < D; ++d) o[d * W] = 0.0f;
      }
    }
}

// An MR x NR tile of dot products over d: element (r, c) is one FMA chain
// over d = 0..D-1 ascending from +0 of a[d][r] * b[d][c] (an MR-row panel and
// an NR-row panel), then times `scale` when kScale.
template <bool kScale>
void dot_tile(const float* __restrict a, const float* __restrict b, int64_t D, float scale, float* out, int64_t ldo) {
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t d = 0; d < D; ++d, a += MR, b += NR) {
    const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m256 av = _mm256_broadcast_ss(a + r);
      acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
    }
  }
  const __m256 sc = _mm256_set1_ps(scale);
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(out + r * ldo, kScale ? _mm256_mul_ps(acc[r][0], sc) : acc[r][0]);
    _mm256_storeu_ps(out + r * ldo + 8, kScale ? _mm256_mul_ps(acc[r][1], sc) : acc[r][1]);
  }
}

// One MR x NR tile of a chunked weighted sum over positions t of a length-n
// range with V chunks:
//   out[r][c] = tree over chunks of (FMA chain over t in chunk ∩ [lo[r], hi[r])
//               ascending, from +0, of A(r, t) * B(t)[c])
// with A(r, t) = a[r*ars + (t - base)*ats] and B(t) = b + (t - base)*bts.
// The tree is a binary counter over chunk indices: chunks before the first
// one with a term are +0 leaves (the zeroed stack holds their subtrees),
// chunks after the last one are +0 leaves folded in by the final flush.
// stack: log2(V) slots of MR x NR floats.
struct SumGeometry {
  int64_t n;
  int v;
  int levels;
  int64_t cs;  // chunk size
};

void chunked_tile(const float* a, int64_t ars, int64_t ats, const float* b, int64_t bts, int64_t base,
                  const int64_t* lo, const int64_t* hi, const SumGeometry& geo, float* stack, float* out,
                  int64_t ldo) {
  int64_t minlo = lo[0], maxlo = lo[0], minhi = hi[0], maxhi = hi[0];
  for (int r = 1; r < MR; ++r) {
    minlo = std::min(minlo, lo[r]), maxlo = std::max(maxlo, lo[r]);
    minhi = std::min(minhi, hi[r]), maxhi = std::max(maxhi, hi[r]);
  }
  const int L = geo.levels;
  const int64_t slot = MR * NR;
  __m256 res[MR][2];
  if (maxhi <= minlo) {  // no terms at all: every leaf is +0
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) res[r][0] = res[r][1] = _mm256_setzero_ps();
  } else {
    for (int64_t x = 0; x < L * slot; ++x) stack[x] = 0.0f;
    const int64_t c_first = minlo / geo.cs, c_end = (maxhi - 1) / geo.cs + 1;
    int64_t aoff[MR];
    for (int r = 0; r < MR; ++r) aoff[r] = r * ars;
    for (int64_t c = c_first; c < c_end; ++c) {
      const int64_t cb = c * geo.cs, ce = std::min(cb + geo.cs, geo.n);
      __m256 acc[MR][2];
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
      // Ragged head: rows start at different t.
      for (int64_t t = std::max(cb, minlo); t < std::min(ce, maxlo); ++t) {
        const float* bt = b + (t - base) * bts;
        const float* at = a + (t - base) * ats;
        const __m256 b0 = _mm256_loadu_ps(bt), b1 = _mm256_loadu_ps(bt + 8);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          if (t >= lo[r] && t < hi[r]) {
            const __m256 av = _mm256_broadcast_ss(at + aoff[r]);
            acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
          }
        }
      }
      // Every row has a term at every t.
      {
        const int64_t t0 = std::max(cb, maxlo), t1 = std::min(ce, minhi);
        const float* bt = b + (t0 - base) * bts;
        const float* at = a + (t0 - base) * ats;
        for (int64_t t = t0; t < t1; ++t, bt += bts, at += ats) {
          const __m256 b0 = _mm256_loadu_ps(bt), b1 = _mm256_loadu_ps(bt + 8);
#pragma GCC unroll 8
          for (int r = 0; r < MR; ++r) {
            const __m256 av = _mm256_broadcast_ss(at + aoff[r]);
            acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
          }
        }
      }
      // Ragged tail: rows end at different t.
      for (int64_t t = std::max(cb, std::max(maxlo, minhi)); t < std::min(ce, maxhi); ++t) {
        const float* bt = b + (t - base) * bts;
        const float* at = a + (t - base) * ats;
        const __m256 b0 = _mm256_loadu_ps(bt), b1 = _mm256_loadu_ps(bt + 8);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          if (t >= lo[r] && t < hi[r]) {
            const __m256 av = _mm256_broadcast_ss(at + aoff[r]);
            acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
          }
        }
      }
      // Chunk c done: merge the left subtrees it completes (left + right).
      int l = 0;
      while ((c >> l) & 1) {
        const float* left = stack + l * slot;
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          acc[r][0] = _mm256_add_ps(_mm256_loadu_ps(left + r * NR), acc[r][0]);
          acc[r][1] = _mm256_add_ps(_mm256_loadu_ps(left + r * NR + 8), acc[r][1]);
        }
        ++l;
      }
      if (l < L) {
        float* dst = stack + l * slot;
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          _mm256_storeu_ps(dst + r * NR, acc[r][0]);
          _mm256_storeu_ps(dst + r * NR + 8, acc[r][1]);
        }
      } else {  // c == V - 1: the root
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) res[r][0] = acc[r][0], res[r][1] = acc[r][1];
      }
    }
    if (c_end < geo.v) {
      // Leaves c_end..V-1 are +0. Walking up from leaf c_end: at level l the
      // node holding it is slot[l] + (that node) when bit l of c_end is set,
      // else (that node) + (an all-zero right sibling).
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) res[r][0] = res[r][1] = _mm256_setzero_ps();
      const __m256 zero = _mm256_setzero_ps();
      for (int l = 0; l < L; ++l) {
        const float* left = stack + l * slot;
        const bool set = (c_end >> l) & 1;
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          if (set) {
            res[r][0] = _mm256_add_ps(_mm256_loadu_ps(left + r * NR), res[r][0]);
            res[r][1] = _mm256_add_ps(_mm256_loadu_ps(left + r * NR + 8), res[r][1]);
          } else {
            res[r][0] = _mm256_add_ps(res[r][0], zero);
            res[r][1] = _mm256_add_ps(res[r][1], zero);
          }
        }
      }
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    _mm256_storeu_ps(out + r * ldo, res[r][0]);
    _mm256_storeu_ps(out + r * ldo + 8, res[r][1]);
  }
}

// max of s[0..n) as a value (any order is exact); NaN if any is NaN; a zero max is +0.
float row_max(const float* s, int64_t n) {
  __m256 mx = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 nan = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 x = _mm256_loadu_ps(s + j);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    mx = _mm256_max_ps(mx, x);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, mx);
  bool any_nan = _mm256_movemask_ps(nan) != 0;
  float m = lanes[0];
  for (int l = 1; l < 8; ++l) m = lanes[l] > m ? lanes[l] : m;
  for (; j < n; ++j) {
    any_nan |= s[j] != s[j];
    m = s[j] > m ? s[j] : m;
  }
  if (any_nan) return std::numeric_limits<float>::quiet_NaN();
  return m + 0.0f;
}

// Canonical sum (chunks over the global length n) of x[0..valid), +0 after.
float masked_row_sum(const float* x, int64_t n, int64_t valid, int v) {
  float vals[kMaxChunks];
  for (int c = 0; c < v; ++c) {
    const int64_t cb = numerics::chunk_begin(n, v, c), ce = std::min(numerics::chunk_end(n, v, c), valid);
    vals[c] = cb < ce ? chunk_sum_row(x + cb, ce - cb) : 0.0f;
  }
  return tree_combine(vals, v, SumCombine<float>());
}

// keep[j] for the probabilities (b, h, i, j0 + j), j < n.
void keep_row(uint8_t* keep, int64_t n, const PhiloxKey& key, uint64_t e0, uint32_t threshold) {
  int64_t j = 0;
  while (j < n) {
    const uint64_t e = e0 + uint64_t(j);
    const int w = int(e & 3);
    const Philox4 r = philox::block(key, e >> 2);
    const int take = int(std::min<int64_t>(4 - w, n - j));
    for (int u = 0; u < take; ++u) keep[j + u] = (r.v[w + u] >> 8) < threshold;
    j += take;
  }
}

// The per-call constants and the packed operands' strides.
// T is the global length n (k and v hold all of it); q holds the Tq query
// rows q0 .. q0 + Tq - 1 (kernels/attention.h: a piece of the queries).
// Query loops run over global rows i; q, dO, out, dq and stats are indexed
// by the local row i - q0.
struct Problem {
  int64_t B, Hq, Hkv, g, T, D, Dp, Tp, Tq, q0;
  float scale, dscale;
  bool dropout;
  PhiloxKey key;
  uint32_t threshold;
  AttentionDropoutIndex index;
  SumGeometry geo;

  Problem(const Tensor& q, const Tensor& k, const AttentionParams& p) {
    B = q.size(0), Hq = q.size(1), T = k.size(2), D = q.size(3), Hkv = k.size(1), g = Hq / Hkv;
    Tq = q.size(2), q0 = p.q_begin;
    Dp = round_up(std::max<int64_t>(D, 1), NR), Tp = round_up(std::max<int64_t>(T, 1), NR);
    scale = float(p.scale), dscale = float(p.dropout_scale);
    dropout = p.dropout, key = p.key, threshold = p.keep_threshold;
    index = attention_dropout_index(p.block, B, Hq, T);
    geo = {T, p.chunks, log2_int(p.chunks), numerics::chunk_size(T, p.chunks)};
  }
};

// Scores of query rows [i0b, i1b) (packed panels qp) against keys [0, i1b) (panels kp)
// into s (ld columns), only the tiles that hold some j <= i; kScale as dot_tile.
template <bool kScale>
void score_block(const Problem& P, const float* qp, const float* kp, int64_t i0b, int64_t i1b, float* s,
                 int64_t ld) {
  const int64_t npan = ceil_div(i1b - i0b, MR);
  for (int64_t ip = 0; ip < npan; ++ip) {
    const int64_t i0 = i0b + ip * MR;
    const int64_t nkp = ceil_div(std::min(i0 + MR, P.T), NR);
    for (int64_t kq = 0; kq < nkp; ++kq)
      dot_tile<kScale>(qp + ip * MR * P.D, kp + kq * NR * P.D, P.D, P.scale, s + ip * MR * ld + kq * NR, ld);
  }
}

// Weighted sums over keys for query rows [i0b, i1b): out rows (ld Dp) =
// chunked sum over keys j <= i of w[i][j] * rows[j] (w: ld_w columns).
void sum_over_keys(const Problem& P, const float* w, int64_t ld_w, const float* rows, int64_t i0b, int64_t i1b,
                   float* stack, float* out) {
  const int64_t npan = ceil_div(i1b - i0b, MR);
  for (int64_t ip = 0; ip < npan; ++ip) {
    const int64_t i0 = i0b + ip * MR;
    int64_t lo[MR], hi[MR];
    for (int r = 0; r < MR; ++r) {
      const int64_t i = std::min(i0 + r, i1b - 1);  // padded rows repeat the last row's range
      lo[r] = 0, hi[r] = i + 1;
    }
    for (int64_t c0 = 0; c0 < P.Dp; c0 += NR)
      chunked_tile(w + ip * MR * ld_w, ld_w, 1, rows + c0, P.Dp, 0, lo, hi, P.geo, stack, out + ip * MR * P.Dp + c0,
                   P.Dp);
  }
}

template <class T>
void store_rows(const float* src, int64_t ld, T* base, int64_t sb, int64_t sh, int64_t st, int64_t sd, int64_t b,
                int64_t h, int64_t t0, int64_t t1, int64_t D) {
  for (int64_t t = t0; t < t1; ++t) {
    T* o = base + b * sb + h * sh + t * st;
    const float* x = src + (t - t0) * ld;
    for (int64_t d = 0; d < D; ++d) o[d * sd] = store<T>(x[d]);
  }
}

template <class T>
void forward_typed(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& params, const Tensor& out,
                   const Tensor& stats) {
  const Problem P(q, k, params);
  const Operand<T> Q = operand<T>(q), K = operand<T>(k), Vv = operand<T>(v);
  T* obase = static_cast<T*>(out.raw_data());
  const int64_t osb = out.strides()[0], osh = out.strides()[1], ost = out.strides()[2], osd = out.strides()[3];
  float* st = static_cast<float*>(stats.raw_data());
  const int64_t nqb = ceil_div(P.Tq, kBlock);
  parallel_for(P.B * P.Hkv * nqb, 1, [&](int64_t tb, int64_t te) {
    std::vector<float> kp(size_t(P.Tp * P.D)), vr(size_t(P.T * P.Dp)), qp(size_t(kBlock * P.D)),
        s(size_t(kBlock * P.Tp)), o(size_t(kBlock * P.Dp)), stack(size_t(std::max(1, P.geo.levels) * MR * NR));
    std::vector<uint8_t> keep(static_cast<size_t>(P.T));
    for (int64_t task = tb; task < te; ++task) {
      const int64_t qb = task % nqb, hk = (task / nqb) % P.Hkv, b = task / (nqb * P.Hkv);
      const int64_t l0 = qb * kBlock, l1 = std::min(P.Tq, l0 + kBlock);  // local rows
      const int64_t i0b = P.q0 + l0, i1b = P.q0 + l1;                     // global rows
      pack_panels<NR>(K, b, hk, 0, i1b, P.D, kp.data());
      pack_rows(Vv, b, hk, 0, i1b, P.D, P.Dp, vr.data());
      for (int64_t r = 0; r < P.g; ++r) {
        const int64_t h = hk * P.g + r;
        pack_panels<MR>(Q, b, h, l0, l1, P.D, qp.data());
        score_block<true>(P, qp.data(), kp.data(), i0b, i1b, s.data(), P.Tp);
        for (int64_t i = i0b; i < i1b; ++i) {
          float* row = s.data() + (i - i0b) * P.Tp;
          const int64_t n = i + 1;
          const float m = row_max(row, n);
          for (int64_t j = 0; j < n; ++j) row[j] = tmath::exp(row[j] - m);
          const float l = masked_row_sum(row, P.T, n, P.geo.v);
          const float rl = 1.0f / l;
          for (int64_t j = 0; j < n; ++j) row[j] = row[j] * rl;
          if (P.dropout) {
            keep_row(keep.data(), n, P.key, P.index(b, h, i - P.q0, 0), P.threshold);
            for (int64_t j = 0; j < n; ++j) row[j] = keep[size_t(j)] ? row[j] * P.dscale : 0.0f;
          }
          float* sti = st + ((b * P.Hq + h) * P.Tq + (i - P.q0)) * 2;
          sti[0] = m;
          sti[1] = l;
        }
        sum_over_keys(P, s.data(), P.Tp, vr.data(), i0b, i1b, stack.data(), o.data());
        store_rows(o.data(), P.Dp, obase, osb, osh, ost, osd, b, h, l0, l1, P.D);
      }
    }
  });
}

// The softmax backward of query row i (global) of head h, over its keys
// j <= i: p[j] becomes P (the probabilities from the saved (m, l)), g[j]
// (dP' on entry) becomes dS; keep[j] holds the dropout mask when there is
// one. Returns Dl, the canonical row sum of dP * P. prod: scratch of T floats.
float softmax_backward_row(const Problem& P, int64_t b, int64_t h, int64_t i, const float* st, float* p, float* g,
                           float* prod, uint8_t* keep) {
  const int64_t n = i + 1, row = (b * P.Hq + h) * P.Tq + (i - P.q0);
  const float m = st[row * 2], rl = 1.0f / st[row * 2 + 1];
  for (int64_t j = 0; j < n; ++j) p[j] = tmath::exp(p[j] - m) * rl;
  if (P.dropout) {
    keep_row(keep, n, P.key, P.index(b, h, i - P.q0, 0), P.threshold);
    for (int64_t j = 0; j < n; ++j) g[j] = keep[j] ? g[j] * P.dscale : 0.0f;
  }
  for (int64_t j = 0; j < n; ++j) prod[j] = g[j] * p[j];
  const float dsum = masked_row_sum(prod, P.T, n, P.geo.v);
  for (int64_t j = 0; j < n; ++j) g[j] = (p[j] * (g[j] - dsum)) * P.scale;
  return dsum;
}

// Backward pass 1: dQ and Dl for blocks of queries.
template <class T>
void backward_queries(const Problem& P, const Operand<T>& Q, const Operand<T>& K, const Operand<T>& Vv,
                      const Operand<T>& dO, const float* st, float* dl, const Tensor& dq) {
  T* qbase = static_cast<T*>(dq.raw_data());
  const int64_t sb = dq.strides()[0], sh = dq.strides()[1], stt = dq.strides()[2], sd = dq.strides()[3];
  const int64_t nqb = ceil_div(P.Tq, kBlock);
  parallel_for(P.B * P.Hkv * nqb, 1, [&](int64_t tb, int64_t te) {
    std::vector<float> kp(size_t(P.Tp * P.D)), vp(size_t(P.Tp * P.D)), kr(size_t(P.T * P.Dp)),
        qp(size_t(kBlock * P.D)), dop(size_t(kBlock * P.D)), s(size_t(kBlock * P.Tp)), gs(size_t(kBlock * P.Tp)),
        prod(static_cast<size_t>(P.T)), o(size_t(kBlock * P.Dp)), stack(size_t(std::max(1, P.geo.levels) * MR * NR));
    std::vector<uint8_t> keep(static_cast<size_t>(P.T));
    for (int64_t task = tb; task < te; ++task) {
      const int64_t qb = task % nqb, hk = (task / nqb) % P.Hkv, b = task / (nqb * P.Hkv);
      const int64_t l0 = qb * kBlock, l1 = std::min(P.Tq, l0 + kBlock);  // local rows
      const int64_t i0b = P.q0 + l0, i1b = P.q0 + l1;                     // global rows
      pack_panels<NR>(K, b, hk, 0, i1b, P.D, kp.data());
      pack_panels<NR>(Vv, b, hk, 0, i1b, P.D, vp.data());
      pack_rows(K, b, hk, 0, i1b, P.D, P.Dp, kr.data());
      for (int64_t r = 0; r < P.g; ++r) {
        const int64_t h = hk * P.g + r;
        pack_panels<MR>(Q, b, h, l0, l1, P.D, qp.data());
        pack_panels<MR>(dO, b, h, l0, l1, P.D, dop.data());
        score_block<true>(P, qp.data(), kp.data(), i0b, i1b, s.data(), P.Tp);
        score_block<false>(P, dop.data(), vp.data(), i0b, i1b, gs.data(), P.Tp);
        for (int64_t i = i0b; i < i1b; ++i)
          dl[(b * P.Hq + h) * P.Tq + (i - P.q0)] =
              softmax_backward_row(P, b, h, i, st, s.data() + (i - i0b) * P.Tp, gs.data() + (i - i0b) * P.Tp,
                                   prod.data(), keep.data());
        sum_over_keys(P, gs.data(), P.Tp, kr.data(), i0b, i1b, stack.data(), o.data());
        store_rows(o.data(), P.Dp, qbase, sb, sh, stt, sd, b, h, l0, l1, P.D);
      }
    }
  });
}

// The canonical sum over the g query heads of a group (rows of `parts`,
// each n floats apart), or the single head's values when g == 1.
void group_sum(const float* parts, int64_t g, int64_t n, int v, float* out) {
  if (g == 1) {
    std::copy(parts, parts + n, out);
    return;
  }
  for (int64_t x = 0; x < n; ++x) out[x] = canonical_sum_ref<float>(parts + x, g, n, v);
}

// Backward pass 2: dK and dV for blocks of keys.
template <class T>
void backward_keys(const Problem& P, const Operand<T>& Q, const Operand<T>& K, const Operand<T>& Vv,
                   const Operand<T>& dO, const float* st, const float* dl, const Tensor& dk, const Tensor& dv) {
  T* kbase = static_cast<T*>(dk.raw_data());
  T* vbase = static_cast<T*>(dv.raw_data());
  const int64_t nkb = ceil_div(P.T, kBlock);
  const int64_t Tr = round_up(std::max<int64_t>(P.T, 1), MR);
  parallel_for(P.B * P.Hkv * nkb, 1, [&](int64_t tb, int64_t te) {
    std::vector<float> kp(size_t(kBlock * P.D)), vp(size_t(kBlock * P.D)), qp(size_t(Tr * P.D)),
        dop(size_t(Tr * P.D)), qr(size_t(P.T * P.Dp)), dor(size_t(P.T * P.Dp)), s(size_t(Tr * kBlock)),
        gs(size_t(Tr * kBlock)), prow(static_cast<size_t>(kBlock)), dk_parts(size_t(P.g * kBlock * P.Dp)),
        dv_parts(size_t(P.g * kBlock * P.Dp)), dk_sum(size_t(kBlock * P.Dp)), dv_sum(size_t(kBlock * P.Dp)),
        stack(size_t(std::max(1, P.geo.levels) * MR * NR));
    std::vector<uint8_t> keep(static_cast<size_t>(kBlock));
    for (int64_t task = tb; task < te; ++task) {
      const int64_t kb = task % nkb, hk = (task / nkb) % P.Hkv, b = task / (nkb * P.Hkv);
      const int64_t j0b = kb * kBlock, j1b = std::min(P.T, j0b + kBlock), nkeys = j1b - j0b;
      // The piece's queries that see some key of the block: global rows qs..qe-1.
      const int64_t qs = std::max(j0b, P.q0), qe = P.q0 + P.Tq, nq = qe - qs;
      pack_panels<NR>(K, b, hk, j0b, j1b, P.D, kp.data());
      pack_panels<NR>(Vv, b, hk, j0b, j1b, P.D, vp.data());
      for (int64_t r = 0; r < P.g; ++r) {
        const int64_t h = hk * P.g + r;
        float* dkp = dk_parts.data() + r * kBlock * P.Dp;
        float* dvp = dv_parts.data() + r * kBlock * P.Dp;
        if (nq <= 0) {  // every chunk of every sum is a +0 leaf
          std::fill(dkp, dkp + kBlock * P.Dp, 0.0f);
          std::fill(dvp, dvp + kBlock * P.Dp, 0.0f);
          continue;
        }
        pack_panels<MR>(Q, b, h, qs - P.q0, qe - P.q0, P.D, qp.data());
        pack_panels<MR>(dO, b, h, qs - P.q0, qe - P.q0, P.D, dop.data());
        pack_rows(Q, b, h, qs - P.q0, qe - P.q0, P.D, P.Dp, qr.data());
        pack_rows(dO, b, h, qs - P.q0, qe - P.q0, P.D, P.Dp, dor.data());
        // Scores and dP' for (i >= qs, j in the block), rows i - qs.
        const int64_t npan = ceil_div(nq, MR), nkp = ceil_div(nkeys, NR);
        for (int64_t ip = 0; ip < npan; ++ip) {
          const int64_t i0 = qs + ip * MR;
          for (int64_t kq = 0; kq < nkp && j0b + kq * NR <= i0 + MR - 1; ++kq) {
            dot_tile<true>(qp.data() + ip * MR * P.D, kp.data() + kq * NR * P.D, P.D, P.scale,
                           s.data() + ip * MR * kBlock + kq * NR, kBlock);
            dot_tile<false>(dop.data() + ip * MR * P.D, vp.data() + kq * NR * P.D, P.D, P.scale,
                            gs.data() + ip * MR * kBlock + kq * NR, kBlock);
          }
        }
        // P' into s and dS into gs for j <= i (the same per-element formulas as pass 1).
        for (int64_t i = qs; i < qe; ++i) {
          float* ps = s.data() + (i - qs) * kBlock;
          float* g = gs.data() + (i - qs) * kBlock;
          const int64_t nv = std::min(j1b, i + 1) - j0b, row = (b * P.Hq + h) * P.Tq + (i - P.q0);
          const float m = st[row * 2], rl = 1.0f / st[row * 2 + 1], dsum = dl[row];
          for (int64_t j = 0; j < nv; ++j) prow[size_t(j)] = tmath::exp(ps[j] - m) * rl;
          if (P.dropout) {
            keep_row(keep.data(), nv, P.key, P.index(b, h, i - P.q0, j0b), P.threshold);
            for (int64_t j = 0; j < nv; ++j) {
              ps[j] = keep[size_t(j)] ? prow[size_t(j)] * P.dscale : 0.0f;
              g[j] = keep[size_t(j)] ? g[j] * P.dscale : 0.0f;
            }
          } else {
            for (int64_t j = 0; j < nv; ++j) ps[j] = prow[size_t(j)];
          }
          for (int64_t j = 0; j < nv; ++j) g[j] = (prow[size_t(j)] * (g[j] - dsum)) * P.scale;
        }
        // dV = sum over the piece's queries i >= j of P'[i][j] dO_i, dK = ... dS[i][j] q_i.
        for (int64_t kt = 0; kt < ceil_div(nkeys, MR); ++kt) {
          int64_t lo[MR], hi[MR];
          for (int q = 0; q < MR; ++q) {
            lo[q] = std::max(qs, j0b + std::min(kt * MR + q, nkeys - 1));  // padded rows repeat the last key's range
            hi[q] = qe;
          }
          for (int64_t c0 = 0; c0 < P.Dp; c0 += NR) {
            chunked_tile(s.data() + kt * MR, 1, kBlock, dor.data() + c0, P.Dp, qs, lo, hi, P.geo, stack.data(),
                         dvp + kt * MR * P.Dp + c0, P.Dp);
            chunked_tile(gs.data() + kt * MR, 1, kBlock, qr.data() + c0, P.Dp, qs, lo, hi, P.geo, stack.data(),
                         dkp + kt * MR * P.Dp + c0, P.Dp);
          }
        }
      }
      group_sum(dk_parts.data(), P.g, kBlock * P.Dp, P.geo.v, dk_sum.data());
      group_sum(dv_parts.data(), P.g, kBlock * P.Dp, P.geo.v, dv_sum.data());
      store_rows(dk_sum.data(), P.Dp, kbase, dk.strides()[0], dk.strides()[1], dk.strides()[2], dk.strides()[3], b,
                 hk, j0b, j1b, P.D);
      store_rows(dv_sum.data(), P.Dp, vbase, dv.strides()[0], dv.strides()[1], dv.strides()[2], dv.strides()[3], b,
                 hk, j0b, j1b, P.D);
    }
  });
}

// The whole backward of one (b, kv head) per task, for short sequences:
// scores, dP, P' and dS of every query head are computed once into
// [queries x keys] scratch and kept for the three sums (dQ over keys, dK and
// dV over queries), instead of pass 2 recomputing scores and dP block by
// block (2 of pass 1 + pass 2's 7 products over d, and the exponentials
// twice). Every value is computed by the same per-element formulas and every
// sum runs the same chunks and tree, so the bits are pass 1 + pass 2's
// (test_attention compares both schedules with the reference). The scratch
// is quadratic in T: attention_backward_cpu takes this path only while it is
// small.
template <class T>
void backward_whole(const Problem& P, const Operand<T>& Q, const Operand<T>& K, const Operand<T>& Vv,
                    const Operand<T>& dO, const float* st, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  T* qbase = static_cast<T*>(dq.raw_data());
  T* kbase = static_cast<T*>(dk.raw_data());
  T* vbase = static_cast<T*>(dv.raw_data());
  const int64_t Tqr = round_up(std::max<int64_t>(P.Tq, 1), MR), Tr = round_up(std::max<int64_t>(P.T, 1), MR);
  const int64_t qe = P.q0 + P.Tq;  // global rows q0 .. qe - 1
  // Columns of s and gs (keys): the dK/dV tiles read Tr of them, padded rows included.
  const int64_t ls = std::max(P.Tp, Tr);
  parallel_for(P.B * P.Hkv, 1, [&](int64_t tb, int64_t te) {
    std::vector<float> kp(size_t(P.Tp * P.D)), vp(size_t(P.Tp * P.D)), kr(size_t(P.T * P.Dp)),
        qp(size_t(Tqr * P.D)), dop(size_t(Tqr * P.D)), qr(size_t(P.Tq * P.Dp)), dor(size_t(P.Tq * P.Dp)),
        s(size_t(Tqr * ls)), gs(size_t(Tqr * ls)), prod(static_cast<size_t>(P.T)), o(size_t(Tqr * P.Dp)),
        dk_parts(size_t(P.g * Tr * P.Dp)), dv_parts(size_t(P.g * Tr * P.Dp)), dk_sum(size_t(Tr * P.Dp)),
        dv_sum(size_t(Tr * P.Dp)), stack(size_t(std::max(1, P.geo.levels) * MR * NR));
    std::vector<uint8_t> keep(static_cast<size_t>(P.T));
    for (int64_t task = tb; task < te; ++task) {
      const int64_t hk = task % P.Hkv, b = task / P.Hkv;
      pack_panels<NR>(K, b, hk, 0, P.T, P.D, kp.data());
      pack_panels<NR>(Vv, b, hk, 0, P.T, P.D, vp.data());
      pack_rows(K, b, hk, 0, P.T, P.D, P.Dp, kr.data());
      for (int64_t r = 0; r < P.g; ++r) {
        const int64_t h = hk * P.g + r;
        pack_panels<MR>(Q, b, h, 0, P.Tq, P.D, qp.data());
        pack_panels<MR>(dO, b, h, 0, P.Tq, P.D, dop.data());
        pack_rows(Q, b, h, 0, P.Tq, P.D, P.Dp, qr.data());
        pack_rows(dO, b, h, 0, P.Tq, P.D, P.Dp, dor.data());
        score_block<true>(P, qp.data(), kp.data(), P.q0, qe, s.data(), ls);
        score_block<false>(P, dop.data(), vp.data(), P.q0, qe, gs.data(), ls);
        // Pass 1's row formulas: dS into gs; then P' (the dropped-out
        // probabilities, pass 2's) over P in s.
        for (int64_t i = P.q0; i < qe; ++i) {
          float* p = s.data() + (i - P.q0) * ls;
          softmax_backward_row(P, b, h, i, st, p, gs.data() + (i - P.q0) * ls, prod.data(), keep.data());
          if (P.dropout)
            for (int64_t j = 0; j <= i; ++j) p[j] = keep[size_t(j)] ? p[j] * P.dscale : 0.0f;
        }
        sum_over_keys(P, gs.data(), ls, kr.data(), P.q0, qe, stack.data(), o.data());
        store_rows(o.data(), P.Dp, qbase, dq.strides()[0], dq.strides()[1], dq.strides()[2], dq.strides()[3], b, h, 0,
                   P.Tq, P.D);
        // dV = sum over queries i >= j of P'[i][j] dO_i, dK = ... dS[i][j] q_i:
        // tile rows are keys, the sums run down the columns of s and gs.
        float* dkp = dk_parts.data() + r * Tr * P.Dp;  // Tr rows: tiles write their padded rows too
        float* dvp = dv_parts.data() + r * Tr * P.Dp;
        for (int64_t kt = 0; kt < ceil_div(P.T, MR); ++kt) {
          int64_t lo[MR], hi[MR];
          for (int q = 0; q < MR; ++q) {
            lo[q] = std::max(P.q0, std::min(kt * MR + q, P.T - 1));  // padded rows repeat the last key's range
            hi[q] = qe;
          }
          for (int64_t c0 = 0; c0 < P.Dp; c0 += NR) {
            chunked_tile(s.data() + kt * MR, 1, ls, dor.data() + c0, P.Dp, P.q0, lo, hi, P.geo, stack.data(),
                         dvp + kt * MR * P.Dp + c0, P.Dp);
            chunked_tile(gs.data() + kt * MR, 1, ls, qr.data() + c0, P.Dp, P.q0, lo, hi, P.geo, stack.data(),
                         dkp + kt * MR * P.Dp + c0, P.Dp);
          }
        }
      }
      group_sum(dk_parts.data(), P.g, Tr * P.Dp, P.geo.v, dk_sum.data());
      group_sum(dv_parts.data(), P.g, Tr * P.Dp, P.geo.v, dv_sum.data());
      store_rows(dk_sum.data(), P.Dp, kbase, dk.strides()[0], dk.strides()[1], dk.strides()[2], dk.strides()[3], b,
                 hk, 0, P.T, P.D);
      store_rows(dv_sum.data(), P.Dp, vbase, dv.strides()[0], dv.strides()[1], dv.strides()[2], dv.strides()[3], b,
                 hk, 0, P.T, P.D);
    }
  });
}

// Which backward schedule: TESSEL_ATTENTION_BACKWARD=whole | blocks forces
// one (tests compare them; the bits are the same), else whole heads while
// their scores and dS fit kWholeBytes and there are tasks for every thread.
constexpr int64_t kWholeBytes = int64_t(4) << 20;
bool backward_whole_heads(const Problem& P) {
  if (const char* e = std::getenv("TESSEL_ATTENTION_BACKWARD"); e != nullptr && *e != 0) {
    const std::string_view v(e);
    TESSEL_CHECK(v == "whole" || v == "blocks" || v == "auto", "attention_backward",
                 "TESSEL_ATTENTION_BACKWARD must be whole, blocks or auto, got '{}'", v);
    if (v != "auto") return v == "whole";
  }
  const int64_t scratch = 2 * round_up(std::max<int64_t>(P.Tq, 1), MR) *
                          std::max(P.Tp, round_up(std::max<int64_t>(P.T, 1), MR)) * int64_t(sizeof(float));
  return scratch <= kWholeBytes && P.B * P.Hkv >= 2 * int64_t(num_threads());
}

// float64: the reference on contiguous copies, one (b, kv head) per task.
template <class C>
std::vector<C> gather(const Tensor& x) {
  std::vector<C> out(size_t(x.numel()));
  const Operand<C> o = operand<C>(x);
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d) out[size_t(((b * H + h) * T + t) * D + d)] = o.row(b, h, t)[d * o.sd];
  return out;
}
template <class C>
void scatter(const std::vector<C>& src, const Tensor& x) {
  C* base = static_cast<C*>(x.raw_data());
  const int64_t B = x.size(0), H = x.size(1), T = x.size(2), D = x.size(3);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t d = 0; d < D; ++d)
          base[b * x.strides()[0] + h * x.strides()[1] + t * x.strides()[2] + d * x.strides()[3]] =
              src[size_t(((b * H + h) * T + t) * D + d)];
}

void attention_forward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                           const Tensor& out, const Tensor& stats) {
  const char* op = "attention_forward";
  check_attention_piece(op, q, k, p);
  if (out.numel() == 0 && stats.numel() == 0) return;
  dispatch_floating(q.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, double>) {
      const auto pr = ref::AttentionProblem<double>::make(q.size(0), q.size(1), k.size(1), k.size(2), q.size(3), p,
                                                             q.size(2));
      std::vector<double> o(size_t(out.numel()));
      ref::attention_forward(pr, gather<double>(q).data(), gather<double>(k).data(), gather<double>(v).data(),
                             o.data(), static_cast<double*>(stats.raw_data()));
      scatter(o, out);
    } else {
      forward_typed<T>(q, k, v, p, out, stats);
    }
  });
}

void attention_backward_cpu(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& stats,
                            const AttentionParams& p, const Tensor& dq, const Tensor& dk, const Tensor& dv) {
  const char* op = "attention_backward";
  check_attention_piece(op, q, k, p);
  if (q.numel() == 0 && k.numel() == 0) return;
  dispatch_floating(q.dtype(), op, [&](auto tag) {
    using T = typename decltype(tag)::type;
    if constexpr (std::is_same_v<T, double>) {
      const auto pr = ref::AttentionProblem<double>::make(q.size(0), q.size(1), k.size(1), k.size(2), q.size(3), p,
                                                             q.size(2));
      std::vector<double> gq(size_t(q.numel())), gk(size_t(k.numel())), gv(size_t(v.numel()));
      ref::attention_backward(pr, gather<double>(q).data(), gather<double>(k).data(), gather<double>(v).data(),
                              gather<double>(dout).data(), static_cast<const double*>(stats.raw_data()), gq.data(),
                              gk.data(), gv.data());
      scatter(gq, dq);
      scatter(gk, dk);
      scatter(gv, dv);
    } else {
      const Problem P(q, k, p);
      const float* st = static_cast<const float*>(stats.raw_data());
      if (backward_whole_heads(P)) {
        backward_whole<T>(P, operand<T>(q), operand<T>(k), operand<T>(v), operand<T>(dout), st, dq, dk, dv);
        return;
      }
      std::vector<float> dl(size_t(P.B * P.Hq * P.Tq));
      backward_queries<T>(P, operand<T>(q), operand<T>(k), operand<T>(v), operand<T>(dout), st, dl.data(), dq);
      backward_keys<T>(P, operand<T>(q), operand<T>(k), operand<T>(v), operand<T>(dout), st, dl.data(), dk, dv);
    }
  });
}

}  // namespace

TESSEL_REGISTER_KERNEL(attention_forward, DeviceType::CPU, attention_forward_cpu);
TESSEL_REGISTER_KERNEL(attention_backward, DeviceType::CPU, attention_backward_cpu);

}  // namespace tessel::kernels::cpu
