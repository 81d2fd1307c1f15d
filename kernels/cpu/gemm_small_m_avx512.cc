// GEMM for a few rows of C (M <= kSmallM; decoding: a batch of one-token
// rows against whole weight matrices), AVX-512F, without packing.
//
// At small M a GEMM is a pass over B: the packed path reads B, writes its
// panels and reads them again, for little arithmetic per element, and runs at
// about a third of the memory bandwidth. Here each group of 16 columns of B
// is read once, straight into registers, and every row of A runs over it:
//   * B unit-stride along k (B = Wᵀ of a row-major W: the Linear forward, the
//     LM head, q·kᵀ): 16 rows of W x 16 k are loaded and transposed in
//     registers (16 x 16), so lane r of vector kk is W[j0 + r, k + kk];
//   * B unit-stride along j (B row-major: p·v): B[k, j0..j0+15] is one load.
// Per output element the arithmetic is the canonical one (kernels/gemm.h),
// exactly as the packed kernel does it: per chunk an FMA chain over k
// ascending from +0; finished chunks filed into the tree like a binary
// counter (slot + value, left + right); C_old + tree when accumulating.
// Lanes past N compute on a repeated column and are never stored.
#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/gemm_internal.h"
#include "runtime/numerics.h"

namespace tessel::kernels::cpu::gemm_detail {
namespace {

inline void transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0x88);
    t[2 * i + 1] = _mm512_shuffle_f32x4(r[i], r[i + 4], 0xDD);
    t[8 + 2 * i] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0x88);
    t[8 + 2 * i + 1] = _mm512_shuffle_f32x4(r[8 + i], r[12 + i], 0xDD);
  }
  // t[2i] holds columns i (lanes 0, 2 of 128 bits) and 8 + i (lanes 1, 3)
  // of rows 0-7; t[8 + 2i] the same of rows 8-15; t[2i + 1] columns 4 + i
  // and 12 + i.
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm512_shuffle_f32x4(t[2 * i], t[8 + 2 * i], 0x88);
    r[8 + i] = _mm512_shuffle_f32x4(t[2 * i], t[8 + 2 * i], 0xDD);
    r[4 + i] = _mm512_shuffle_f32x4(t[2 * i + 1], t[8 + 2 * i + 1], 0x88);
    r[12 + i] = _mm512_shuffle_f32x4(t[2 * i + 1], t[8 + 2 * i + 1], 0xDD);
  }
}

// One group of nj <= 16 columns [j0, j0 + nj) of C, all M rows.
template <int M, bool KContiguous>
void group(const GemmArgs& g, int64_t j0, int nj, int64_t j_end, int levels) {
  const int V = g.chunks;
  const __mmask16 lanes = nj == 16 ? __mmask16(0xffff) : __mmask16((1u << nj) - 1);
  // KContiguous: the 16 rows of W (columns of B); a lane past N re-reads the last one.
  const float* rows[16];
  // The next group's rows are prefetched while this one runs (a row is only K
  // floats, too short a stream for the hardware prefetcher to ramp up on):
  // GPT-2's LM head, M = 4, went from 14 to 23 GB/s of B on 2 threads.
  const float* next[16];
  if (KContiguous)
    for (int r = 0; r < 16; ++r) {
      rows[r] = g.B + (j0 + std::min(r, nj - 1)) * g.b_col_stride;
      next[r] = g.B + std::min(j0 + 16 + r, j_end - 1) * g.b_col_stride;
    }
  __m512 stack[10][M];  // the tree's pending left subtrees (levels <= 10)
  for (int c = 0; c < V; ++c) {
    const int64_t k0 = numerics::chunk_begin(g.K, V, c), k1 = numerics::chunk_end(g.K, V, c);
    __m512 acc[M];
    for (int m = 0; m < M; ++m) acc[m] = _mm512_setzero_ps();
    if (KContiguous) {
      for (int64_t k = k0; k < k1; k += 16) {
        const int n = int(std::min<int64_t>(16, k1 - k));
        const __mmask16 kmask = n == 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
        __m512 t[16];
        for (int r = 0; r < 16; ++r) _mm_prefetch(reinterpret_cast<const char*>(next[r] + k), _MM_HINT_T0);
        for (int r = 0; r < 16; ++r) t[r] = _mm512_maskz_loadu_ps(kmask, rows[r] + k);
        transpose16(t);
        for (int kk = 0; kk < n; ++kk)
          for (int m = 0; m < M; ++m)
            acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(g.A[m * g.a_row_stride + (k + kk) * g.a_col_stride]), t[kk],
                                     acc[m]);
      }
    } else {
      for (int64_t k = k0; k < k1; ++k) {
        const __m512 b = _mm512_maskz_loadu_ps(lanes, g.B + k * g.b_row_stride + j0);
        for (int m = 0; m < M; ++m)
          acc[m] = _mm512_fmadd_ps(_mm512_set1_ps(g.A[m * g.a_row_stride + k * g.a_col_stride]), b, acc[m]);
      }
    }
    // File chunk c: while bit l of c is set, v = slot[l] + v.
    int l = 0;
    while (l < levels && ((c >> l) & 1)) {
      for (int m = 0; m < M; ++m) acc[m] = _mm512_add_ps(stack[l][m], acc[m]);
      ++l;
    }
    if (l < levels) {
      for (int m = 0; m < M; ++m) stack[l][m] = acc[m];
      continue;
    }
    for (int m = 0; m < M; ++m) {
      float* out = g.C + m * g.c_row_stride + j0;
      __m512 v = acc[m];
      if (g.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(lanes, out), v);
      _mm512_mask_storeu_ps(out, lanes, v);
    }
  }
}

template <int M>
void columns(const GemmArgs& g, int64_t j_begin, int64_t j_end, int levels) {
  const bool kcontig = g.b_row_stride == 1;
  for (int64_t j0 = j_begin; j0 < j_end; j0 += 16) {
    const int nj = int(std::min<int64_t>(16, j_end - j0));
    if (kcontig) {
      group<M, true>(g, j0, nj, j_end, levels);
    } else {
      group<M, false>(g, j0, nj, j_end, levels);
    }
  }
}

}  // namespace

void small_m_f32_avx512(const GemmArgs& g, int64_t j_begin, int64_t j_end) {
  int levels = 0;
  while ((1 << levels) < g.chunks) ++levels;
  switch (g.M) {
    case 1: return columns<1>(g, j_begin, j_end, levels);
    case 2: return columns<2>(g, j_begin, j_end, levels);
    case 3: return columns<3>(g, j_begin, j_end, levels);
    case 4: return columns<4>(g, j_begin, j_end, levels);
    case 5: return columns<5>(g, j_begin, j_end, levels);
    case 6: return columns<6>(g, j_begin, j_end, levels);
    case 7: return columns<7>(g, j_begin, j_end, levels);
    case 8: return columns<8>(g, j_begin, j_end, levels);
    default: return;
  }
}

}  // namespace tessel::kernels::cpu::gemm_detail
