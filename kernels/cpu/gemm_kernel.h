#pragma once
// The GEMM micro-kernel, written once over a small vector-traits type and
// instantiated by each ISA's translation unit (gemm_avx2.cc, gemm_avx512.cc).
//
// Everything here has internal linkage (anonymous namespace): the same
// template compiled with -mavx512f in one file and without in another must
// not be merged by the linker.
//
// Per output element the kernel performs exactly the canonical sequence:
// one FMA per k in ascending order from +0 (or from the stored partial sum of
// the same chunk), then the tree merges `slot + value` (left + right), then
// `C_old + tree` when accumulating. Padded rows/columns of an edge tile are
// computed from zero padding and never written, so an element's arithmetic
// does not depend on where its tile sits.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm_internal.h"

namespace tessel::kernels::cpu::gemm_detail {
namespace {

struct F32x8 {
  using T = float;
  using V = __m256;
  static constexpr int W = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const T* p) { return _mm256_loadu_ps(p); }
  static void store(T* p, V v) { _mm256_storeu_ps(p, v); }
  static V bcast(const T* p) { return _mm256_broadcast_ss(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
};

struct F64x4 {
  using T = double;
  using V = __m256d;
  static constexpr int W = 4;
  static V zero() { return _mm256_setzero_pd(); }
  static V load(const T* p) { return _mm256_loadu_pd(p); }
  static void store(T* p, V v) { _mm256_storeu_pd(p, v); }
  static V bcast(const T* p) { return _mm256_broadcast_sd(p); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  static V add(V a, V b) { return _mm256_add_pd(a, b); }
};

#if defined(__AVX512F__)
struct F32x16 {
  using T = float;
  using V = __m512;
  static constexpr int W = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const T* p) { return _mm512_loadu_ps(p); }
  static void store(T* p, V v) { _mm512_storeu_ps(p, v); }
  static V bcast(const T* p) { return _mm512_set1_ps(*p); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
};
#endif

// MR x (NV*W) tile over one K block (see TileJob).
template <class VT, int MR, int NV>
void micro_kernel(const typename VT::T* __restrict a, const typename VT::T* __restrict b,
                  const TileJob<typename VT::T>& job) {
  using T = typename VT::T;
  using V = typename VT::V;
  constexpr int W = VT::W;
  constexpr int NR = NV * W;
  const KSegment* seg = job.segs;
  const KSegment* const seg_end = seg + job.nsegs;
  T* const partial = job.partial;
  T* const stack = job.stack;
  const int64_t slot_stride = job.slot_stride;
  const int levels = job.levels;

  for (; seg != seg_end; ++seg) {
    V acc[MR][NV];
    if (!seg->first) {
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] = VT::load(partial + r * NR + v * W);
    } else {
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] = VT::zero();
    }

    for (int64_t k = seg->len; k > 0; --k) {
      V bv[NV];
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) bv[v] = VT::load(b + v * W);
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r) {
        V av = VT::bcast(a + r);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] = VT::fma(av, bv[v], acc[r][v]);
      }
      a += MR;
      b += NR;
    }

    if (!seg->last) {  // the chunk continues in the next K block
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) VT::store(partial + r * NR + v * W, acc[r][v]);
      continue;
    }

    // Chunk complete: merge it into the tree (left subtree + this one).
    int level = 0;
    while ((seg->chunk >> level) & 1) {
      const T* left = stack + level * slot_stride;
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) acc[r][v] = VT::add(VT::load(left + r * NR + v * W), acc[r][v]);
      ++level;
    }
    if (level < levels) {  // a left subtree waiting for its right half
      T* slot = stack + level * slot_stride;
#pragma GCC unroll 32
      for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v) VT::store(slot + r * NR + v * W, acc[r][v]);
      continue;
    }

    // The root: write C.
    if (job.mr == MR && job.nr == NR) {
      const int64_t ldc = job.ldc;
      T* const c = job.c;
      if (job.accumulate) {
#pragma GCC unroll 32
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
          for (int v = 0; v < NV; ++v)
            VT::store(c + r * ldc + v * W, VT::add(VT::load(c + r * ldc + v * W), acc[r][v]));
      } else {
#pragma GCC unroll 32
        for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
          for (int v = 0; v < NV; ++v) VT::store(c + r * ldc + v * W, acc[r][v]);
      }
      continue;
    }
    alignas(64) T tile[MR * NR];
#pragma GCC unroll 32
    for (int r = 0; r < MR; ++r)
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) VT::store(tile + r * NR + v * W, acc[r][v]);
    for (int r = 0; r < job.mr; ++r) {
      T* crow = job.c + r * job.ldc;
      const T* trow = tile + r * NR;
      if (job.accumulate) {
        for (int j = 0; j < job.nr; ++j) crow[j] = crow[j] + trow[j];
      } else {
        for (int j = 0; j < job.nr; ++j) crow[j] = trow[j];
      }
    }
  }
}

}  // namespace
}  // namespace tessel::kernels::cpu::gemm_detail
