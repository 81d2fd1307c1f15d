// Packing of GEMM operands into k-major micro-panels (layout: gemm_internal.h).
//
// Packing only moves values (and writes zeros for the padded rows/columns of
// edge panels); it never pads or reorders K, so it cannot change a result.
// Fast paths, AVX2, used by both the AVX2 and AVX-512 kernels:
//   * the panel's lines are contiguous along M/N (A transposed, B row-major):
//     one vector copy per k;
//   * the panel's lines are contiguous along K (A row-major, B transposed):
//     8 x 8 in-register transposes.
// Any other stride falls back to scalar loops.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/gemm_internal.h"

namespace tessel::kernels::cpu::gemm_detail {
namespace {

inline __m256i lane_mask(int64_t n) {  // first n (0..8) lanes set
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), idx);
}

inline void transpose8x8(__m256& r0, __m256& r1, __m256& r2, __m256& r3, __m256& r4, __m256& r5, __m256& r6,
                         __m256& r7) {
  __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1);
  __m256 t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3);
  __m256 t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5);
  __m256 t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
  __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2));
  __m256 s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0));
  __m256 s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
  r0 = _mm256_permute2f128_ps(s0, s4, 0x20);
  r1 = _mm256_permute2f128_ps(s1, s5, 0x20);
  r2 = _mm256_permute2f128_ps(s2, s6, 0x20);
  r3 = _mm256_permute2f128_ps(s3, s7, 0x20);
  r4 = _mm256_permute2f128_ps(s0, s4, 0x31);
  r5 = _mm256_permute2f128_ps(s1, s5, 0x31);
  r6 = _mm256_permute2f128_ps(s2, s6, 0x31);
  r7 = _mm256_permute2f128_ps(s3, s7, 0x31);
}

// Every panel at once when the panels' k-rows are contiguous in memory
// (element (w, k) at src[w + k*k_stride]: A transposed, B row-major). Rows
// are taken a few at a time (as many as fit L1 together): each panel then
// receives one contiguous run of stores, while the rows, read once from
// memory, are re-read from L1; the next group of rows is prefetched (each row
// usually sits on its own page, out of the hardware prefetcher's reach).
template <int P>
void pack_rows_contiguous(const float* src, int64_t k_stride, int64_t width, int64_t klen, float* dst) {
  constexpr int G = (P + 7) / 8;
  const int64_t panels = (width + P - 1) / P, full_panels = width / P;
  const int64_t panel_stride = klen * P;
  const int64_t row_bytes = width * int64_t(sizeof(float));
  const int64_t group = std::clamp<int64_t>((16 << 10) / std::max<int64_t>(row_bytes, 1), 1, 8);
  for (int64_t k0 = 0; k0 < klen; k0 += group) {
    const int64_t k1 = std::min(klen, k0 + group);
    for (int64_t k = k1; k < std::min(klen, k1 + group); ++k) {
      const char* pf = reinterpret_cast<const char*>(src + k * k_stride);
      for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(pf + b, _MM_HINT_T0);
    }
    for (int64_t p = 0; p < panels; ++p) {
      const bool full = p < full_panels;
      for (int64_t k = k0; k < k1; ++k) {
        const float* s = src + k * k_stride + p * P;
        float* d = dst + p * panel_stride + k * P;
        for (int g = 0; g < G; ++g) {
          const int nd = P - 8 * g < 8 ? P - 8 * g : 8;  // lanes of this group inside the panel
          __m256 v;
          if (full && nd == 8) {
            v = _mm256_loadu_ps(s + 8 * g);
          } else {
            const int64_t ns = std::clamp<int64_t>(width - p * P - 8 * g, 0, nd);
            v = _mm256_maskload_ps(s + 8 * g, lane_mask(ns));
          }
          if (nd == 8) {
            _mm256_storeu_ps(d + 8 * g, v);
          } else {
            _mm256_maskstore_ps(d + 8 * g, lane_mask(nd), v);
          }
        }
      }
    }
  }
}

// One panel: `width` (<= P) lines, line w at src + w*line_stride, k at
// + k*k_stride; writes klen x P (k-major) to dst, lines >= width as zeros.
// P need not be a multiple of 8: vectors of 8 are stored in ascending address
// order, so a store that runs past the line into the next k is overwritten
// by the next k (and the last one runs into the next panel, written later,
// or the caller's slack).
template <int P>
void pack_panel_f32(const float* src, int64_t line_stride, int64_t k_stride, int64_t width, int64_t klen,
                    float* dst) {
  constexpr int G = (P + 7) / 8;  // groups of 8 lines
  if (k_stride == 1) {
    // Each line is contiguous along k: transpose 8 lines x 8 k at a time.
    const int64_t k8 = klen & ~int64_t(7);
    for (int64_t k = 0; k < k8; k += 8) {
      __m256 r[G][8];
      for (int g = 0; g < G; ++g) {
        for (int i = 0; i < 8; ++i) {
          int64_t w = 8 * g + i;
          r[g][i] = w < width ? _mm256_loadu_ps(src + w * line_stride + k) : _mm256_setzero_ps();
        }
        transpose8x8(r[g][0], r[g][1], r[g][2], r[g][3], r[g][4], r[g][5], r[g][6], r[g][7]);
      }
      for (int i = 0; i < 8; ++i)
        for (int g = 0; g < G; ++g) _mm256_storeu_ps(dst + (k + i) * P + 8 * g, r[g][i]);
    }
    for (int64_t k = k8; k < klen; ++k)
      for (int w = 0; w < P; ++w) dst[k * P + w] = w < width ? src[w * line_stride + k] : 0.0f;
    return;
  }
  for (int64_t k = 0; k < klen; ++k)
    for (int w = 0; w < P; ++w) dst[k * P + w] = w < width ? src[w * line_stride + k * k_stride] : 0.0f;
}

template <int P, class T>
void pack_panel_generic(const T* src, int64_t line_stride, int64_t k_stride, int64_t width, int64_t klen, T* dst) {
  if (width == P && line_stride == 1) {
    for (int64_t k = 0; k < klen; ++k)
      for (int w = 0; w < P; ++w) dst[k * P + w] = src[k * k_stride + w];
    return;
  }
  for (int64_t k = 0; k < klen; ++k)
    for (int w = 0; w < P; ++w) dst[k * P + w] = w < width ? src[w * line_stride + k * k_stride] : T(0);
}

}  // namespace

template <int MR>
void pack_a_f32(const float* src, int64_t rs, int64_t cs, int64_t rows, int64_t klen, float* dst) {
  if (rs == 1) return pack_rows_contiguous<MR>(src, cs, rows, klen, dst);
  for (int64_t r0 = 0; r0 < rows; r0 += MR)
    pack_panel_f32<MR>(src + r0 * rs, rs, cs, std::min<int64_t>(MR, rows - r0), klen, dst + r0 * klen);
}

template <int NR>
void pack_b_f32(const float* src, int64_t rs, int64_t cs, int64_t klen, int64_t cols, float* dst) {
  if (cs == 1) return pack_rows_contiguous<NR>(src, rs, cols, klen, dst);
  for (int64_t c0 = 0; c0 < cols; c0 += NR)
    pack_panel_f32<NR>(src + c0 * cs, cs, rs, std::min<int64_t>(NR, cols - c0), klen, dst + c0 * klen);
}

template <int MR>
void pack_a_f64(const double* src, int64_t rs, int64_t cs, int64_t rows, int64_t klen, double* dst) {
  for (int64_t r0 = 0; r0 < rows; r0 += MR)
    pack_panel_generic<MR>(src + r0 * rs, rs, cs, std::min<int64_t>(MR, rows - r0), klen, dst + r0 * klen);
}

template <int NR>
void pack_b_f64(const double* src, int64_t rs, int64_t cs, int64_t klen, int64_t cols, double* dst) {
  for (int64_t c0 = 0; c0 < cols; c0 += NR)
    pack_panel_generic<NR>(src + c0 * cs, cs, rs, std::min<int64_t>(NR, cols - c0), klen, dst + c0 * klen);
}

template void pack_a_f32<6>(const float*, int64_t, int64_t, int64_t, int64_t, float*);
template void pack_a_f32<8>(const float*, int64_t, int64_t, int64_t, int64_t, float*);
template void pack_b_f32<16>(const float*, int64_t, int64_t, int64_t, int64_t, float*);
template void pack_b_f32<48>(const float*, int64_t, int64_t, int64_t, int64_t, float*);
template void pack_a_f64<6>(const double*, int64_t, int64_t, int64_t, int64_t, double*);
template void pack_b_f64<8>(const double*, int64_t, int64_t, int64_t, int64_t, double*);

}  // namespace tessel::kernels::cpu::gemm_detail
