#pragma once
// Plain scalar reference for the fused causal attention kernels: the order of
// kernels/attention.h written as directly as possible, on contiguous
// [B, H, T, D] arrays of the compute type. The optimised kernels
// (kernels/cpu/attention.cc) must equal it bit for bit (test/test_attention.cc);
// float64 tensors are computed by it.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "kernels/attention.h"
#include "kernels/canonical.h"
#include "runtime/philox.h"
#include "runtime/tmath.h"

namespace tessel::kernels::ref {

// T is the global length n (k and v hold all n keys); q holds the Tq query
// rows q0 .. q0 + Tq - 1 (a piece of the queries, kernels/attention.h; the
// whole sequence: Tq = T, q0 = 0).
template <class C>
struct AttentionProblem {
  int64_t B = 0, Hq = 0, Hkv = 0, T = 0, D = 0, Tq = 0, q0 = 0;
  C scale = C(1);
  int chunks = 16;
  bool dropout = false;
  PhiloxKey key{};
  uint32_t keep_threshold = 0;
  C dropout_scale = C(1);
  AttentionDropoutIndex index;

  static AttentionProblem make(int64_t B, int64_t Hq, int64_t Hkv, int64_t T, int64_t D, const AttentionParams& p,
                               int64_t Tq = -1) {
    AttentionProblem a;
    a.B = B, a.Hq = Hq, a.Hkv = Hkv, a.T = T, a.D = D;
    a.Tq = Tq < 0 ? T : Tq, a.q0 = p.q_begin;
    a.scale = C(p.scale);
    a.chunks = p.chunks;
    a.dropout = p.dropout;
    a.key = p.key;
    a.keep_threshold = p.keep_threshold;
    a.dropout_scale = C(p.dropout_scale);
    a.index = attention_dropout_index(p.block, B, Hq, T);
    return a;
  }
  bool keep(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return (philox::bits_at(key, index(b, h, i, j)) >> 8) < keep_threshold;
  }
};

// One FMA per element, ascending, from +0 (the score and dP dot products over head_dim).
template <class C>
C dot_chain(const C* a, const C* b, int64_t n) {
  C acc = C(0);
  for (int64_t d = 0; d < n; ++d) acc = std::fma(a[d], b[d], acc);
  return acc;
}

// Chunked FMA sum over positions [0, n) with V chunks where only t in [lo, hi)
// contribute: chunk c = FMA chain of term(t) over its contributing t
// ascending from +0 (+0 when it has none); chunks combined by the balanced tree.
template <class C, class A, class B>
C chunked_fma(int64_t n, int v, int64_t lo, int64_t hi, A a, B b) {
  C vals[kMaxChunks];
  for (int c = 0; c < v; ++c) {
    C acc = C(0);
    const int64_t cb = numerics::chunk_begin(n, v, c), ce = numerics::chunk_end(n, v, c);
    for (int64_t t = cb < lo ? lo : cb; t < ce && t < hi; ++t) acc = std::fma(a(t), b(t), acc);
    vals[c] = acc;
  }
  return tree_combine(vals, v, SumCombine<C>());
}

// Canonical sum of the length-n row x[0..valid), +0 after.
template <class C>
C masked_row_sum(const C* x, int64_t n, int64_t valid, int v) {
  return canonical_reduce_ref<C>(
      n, v, C(0), [&](int64_t t) { return t < valid ? x[t] : C(0); }, SumCombine<C>());
}

template <class C>
C scores_max(const C* s, int64_t n) {
  C m = -std::numeric_limits<C>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    if (s[j] != s[j]) return std::numeric_limits<C>::quiet_NaN();
    if (s[j] > m) m = s[j];
  }
  return m + C(0);  // a zero maximum is +0
}

// Recomputes local query row `row` (global row i = q0 + row) of one head: scores s,
// probabilities p and (with dropout) p' = dropped p, for keys j <= i. m and l
// from the forward (or computed here when `stats_in` is false, and returned).
template <class C>
void probs_row(const AttentionProblem<C>& pr, const C* q, const C* k, int64_t b, int64_t h, int64_t row,
               bool stats_in, C& m, C& l, C* s, C* p, C* pd) {
  const int64_t T = pr.T, D = pr.D, i = pr.q0 + row, n = i + 1;
  for (int64_t j = 0; j < n; ++j) s[j] = dot_chain(q + row * D, k + j * D, D) * pr.scale;
  if (!stats_in) m = scores_max(s, n);
  std::vector<C> e(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) e[size_t(j)] = tmath::exp(s[j] - m);
  if (!stats_in) l = masked_row_sum(e.data(), T, n, pr.chunks);
  const C r = C(1) / l;
  for (int64_t j = 0; j < n; ++j) {
    p[j] = e[size_t(j)] * r;
    pd[j] = !pr.dropout ? p[j] : (pr.keep(b, h, row, j) ? p[j] * pr.dropout_scale : C(0));
  }
}

// out, stats ([B, Hq, Tq, 2]) from q ([B, Hq, Tq, D]), k, v ([B, Hkv, T, D]).
template <class C>
void attention_forward(const AttentionProblem<C>& pr, const C* q, const C* k, const C* v, C* out, C* stats) {
  const int64_t T = pr.T, Tq = pr.Tq, D = pr.D, g = pr.Hq / pr.Hkv;
  std::vector<C> s(static_cast<size_t>(T)), p(static_cast<size_t>(T)), pd(static_cast<size_t>(T));
  for (int64_t b = 0; b < pr.B; ++b)
    for (int64_t h = 0; h < pr.Hq; ++h) {
      const C* qh = q + (b * pr.Hq + h) * Tq * D;
      const C* kh = k + (b * pr.Hkv + h / g) * T * D;
      const C* vh = v + (b * pr.Hkv + h / g) * T * D;
      for (int64_t r = 0; r < Tq; ++r) {
        C m = 0, l = 0;
        probs_row(pr, qh, kh, b, h, r, false, m, l, s.data(), p.data(), pd.data());
        C* o = out + ((b * pr.Hq + h) * Tq + r) * D;
        for (int64_t d = 0; d < D; ++d)
          o[d] = chunked_fma<C>(T, pr.chunks, 0, pr.q0 + r + 1, [&](int64_t t) { return pd[size_t(t)]; },
                                [&](int64_t t) { return vh[t * D + d]; });
        C* st = stats + ((b * pr.Hq + h) * Tq + r) * 2;
        st[0] = m;
        st[1] = l;
      }
    }
}

// dq, dk, dv from q, k, v, dout and the forward's stats (dk, dv: sums over
// the piece's queries, kernels/attention.h).
template <class C>
void attention_backward(const AttentionProblem<C>& pr, const C* q, const C* k, const C* v, const C* dout,
                        const C* stats, C* dq, C* dk, C* dv) {
  const int64_t T = pr.T, Tq = pr.Tq, q0 = pr.q0, D = pr.D, g = pr.Hq / pr.Hkv;
  const int V = pr.chunks;
  // Per query head: P' and dS of the piece's rows (columns j <= i used), dk/dv per head.
  std::vector<C> P(size_t(Tq * T)), PD(size_t(Tq * T)), DS(size_t(Tq * T));
  std::vector<C> dp(static_cast<size_t>(T)), prod(static_cast<size_t>(T));
  std::vector<C> dk_h(size_t(g * T * D)), dv_h(size_t(g * T * D));
  for (int64_t b = 0; b < pr.B; ++b)
    for (int64_t hk = 0; hk < pr.Hkv; ++hk) {
      const C* kh = k + (b * pr.Hkv + hk) * T * D;
      const C* vh = v + (b * pr.Hkv + hk) * T * D;
      for (int64_t r = 0; r < g; ++r) {
        const int64_t h = hk * g + r;
        const C* qh = q + (b * pr.Hq + h) * Tq * D;
        const C* doh = dout + (b * pr.Hq + h) * Tq * D;
        for (int64_t ri = 0; ri < Tq; ++ri) {
          const int64_t n = q0 + ri + 1;
          C m = stats[((b * pr.Hq + h) * Tq + ri) * 2], l = stats[((b * pr.Hq + h) * Tq + ri) * 2 + 1];
          C* s = DS.data() + ri * T;  // scores land here first, then dS overwrites them
          C* p = P.data() + ri * T;
          probs_row(pr, qh, kh, b, h, ri, true, m, l, s, p, PD.data() + ri * T);
          for (int64_t j = 0; j < n; ++j) {
            C gj = dot_chain(doh + ri * D, vh + j * D, D);
            dp[size_t(j)] = !pr.dropout ? gj : (pr.keep(b, h, ri, j) ? gj * pr.dropout_scale : C(0));
            prod[size_t(j)] = dp[size_t(j)] * p[j];
          }
          const C Dl = masked_row_sum(prod.data(), T, n, V);
          for (int64_t j = 0; j < n; ++j) s[j] = (p[j] * (dp[size_t(j)] - Dl)) * pr.scale;
          C* dqi = dq + ((b * pr.Hq + h) * Tq + ri) * D;
          for (int64_t d = 0; d < D; ++d)
            dqi[d] = chunked_fma<C>(T, V, 0, n, [&](int64_t t) { return s[t]; },
                                    [&](int64_t t) { return kh[t * D + d]; });
        }
        // Sums over the piece's global query rows t >= j (local row t - q0).
        for (int64_t j = 0; j < T; ++j)
          for (int64_t d = 0; d < D; ++d) {
            const int64_t lo = j > q0 ? j : q0;
            dk_h[size_t((r * T + j) * D + d)] =
                chunked_fma<C>(T, V, lo, q0 + Tq, [&](int64_t t) { return DS[size_t((t - q0) * T + j)]; },
                               [&](int64_t t) { return qh[(t - q0) * D + d]; });
            dv_h[size_t((r * T + j) * D + d)] =
                chunked_fma<C>(T, V, lo, q0 + Tq, [&](int64_t t) { return PD[size_t((t - q0) * T + j)]; },
                               [&](int64_t t) { return doh[(t - q0) * D + d]; });
          }
      }
      C* dkh = dk + (b * pr.Hkv + hk) * T * D;
      C* dvh = dv + (b * pr.Hkv + hk) * T * D;
      for (int64_t x = 0; x < T * D; ++x) {
        if (g == 1) {
          dkh[x] = dk_h[size_t(x)];
          dvh[x] = dv_h[size_t(x)];
        } else {
          dkh[x] = canonical_sum_ref<C>(dk_h.data() + x, g, T * D, V);
          dvh[x] = canonical_sum_ref<C>(dv_h.data() + x, g, T * D, V);
        }
      }
    }
}

}  // namespace tessel::kernels::ref
