#pragma once
// Internals shared by the GEMM driver (gemm.cc) and its per-ISA micro-kernels
// (gemm_avx2.cc, gemm_avx512.cc). Declarations and plain data only: code that
// is compiled with different -m flags must never be shared through inline
// functions here (the linker could keep the AVX-512 copy for everyone).
//
// Blocking (see docs in gemm.cc): C is cut into "units" of MR x NR tiles; one
// thread computes a unit over all of K, block by block. A K block is a run of
// whole chunks (or one piece of a chunk longer than the block limit). For each
// block the unit's rows of A and columns of B are packed into micro-panels:
//   A: panel p holds rows [p*MR, p*MR+MR) as klen x MR (k-major, rows padded
//      with zeros), B: panel q holds columns [q*NR, q*NR+NR) as klen x NR.
// The micro-kernel runs one *segment* -- a k range inside one chunk -- of one
// tile, then files the result: the chunk goes on on the next block (store the
// partial sum), or the chunk is complete and is merged into the tile's tree
// stack, or the tree is complete and the tile is written to C.
#include <cstdint>

#include "kernels/gemm.h"

namespace tessel::kernels::cpu::gemm_detail {

// A k range inside one chunk: a whole chunk, or one piece of a chunk longer
// than the K block limit.
struct KSegment {
  int64_t k0, len;
  int chunk;
  bool first, last;  // first / last piece of its chunk
};

// One tile over one K block: the block's segments in k order, and where each
// segment's result goes.
template <class T>
struct TileJob {
  const KSegment* segs = nullptr;
  int nsegs = 0;
  // A segment that is not its chunk's first continues the FMA chain from
  // this MR x NR tile (row-major, NR wide); one that is not its chunk's last
  // stores its sums here. Otherwise a segment starts from +0.
  T* partial = nullptr;
  // A complete chunk is merged into the tree stack: slot l (an MR x NR tile
  // at stack + l*slot_stride) holds the pending left subtree of size 2^l.
  // While bit l of the chunk index is set: v = slot[l] + v, l++. If l
  // reaches `levels` (= log2 V) the tree is done: write C (C_old + v when
  // accumulating); else slot[l] = v.
  T* stack = nullptr;
  int64_t slot_stride = 0;
  int levels = 0;
  // The tile of C: rows [0, mr), columns [0, nr) at c + i*ldc + j.
  T* c = nullptr;
  int64_t ldc = 0;
  int mr = 0, nr = 0;
  bool accumulate = false;
};

// Runs every segment of job.segs for one tile. a: the block's klen x MR
// panel, b: its klen x NR panel (k-major; the segments are consecutive k
// ranges from the block's start). Empty segments (empty chunks) give +0 and
// read nothing.
template <class T>
using MicroKernel = void (*)(const T* a, const T* b, const TileJob<T>& job);

// Packs `rows` rows x `klen` columns of A (element (i,k) at src[i*rs + k*cs])
// into ceil(rows/MR) panels of klen x MR. dst needs kPackSlack extra elements.
template <class T>
using PackA = void (*)(const T* src, int64_t rs, int64_t cs, int64_t rows, int64_t klen, T* dst);
// Packs `klen` rows x `cols` columns of B (element (k,j) at src[k*rs + j*cs])
// into ceil(cols/NR) panels of klen x NR. dst needs kPackSlack extra elements.
template <class T>
using PackB = void (*)(const T* src, int64_t rs, int64_t cs, int64_t klen, int64_t cols, T* dst);

inline constexpr int64_t kPackSlack = 64;

// A GEMM of at most kSmallM rows whose B is unit-stride along k or along j,
// without packing: columns [j_begin, j_end) of C, all rows.
template <class T>
using SmallM = void (*)(const GemmArgsT<T>& g, int64_t j_begin, int64_t j_end);
inline constexpr int64_t kSmallM = 8;

// One code path: tile shape, its micro-kernel and packers, and the blocking
// limits tuned for it.
template <class T>
struct IsaImpl {
  const char* name;
  int mr, nr;
  MicroKernel<T> kernel;
  PackA<T> pack_a;
  PackB<T> pack_b;
  int64_t kc_max;     // longest K block
  int64_t mc_max;     // rows of C per unit (multiple of mr)
  int64_t nc_min, nc_max;  // columns of C per unit (multiples of nr): nc_max
                           // unless B packed over all of K would exceed
                           // whole_k_pack_bytes, then less, down to nc_min
  // B is packed once for all of K per column range while that takes at most
  // this many bytes per thread (else per K block per unit).
  int64_t whole_k_pack_bytes = int64_t(24) << 20;
  // K up to this is a single block (kc_max does not apply); then units have
  // at most a_block_bytes / (K * sizeof(T)) rows (>= mr, <= mc_max).
  int64_t one_block_k_max = 2048;
  int64_t a_block_bytes = int64_t(512) << 10;
  // Small-M path (null: the packed path for every M).
  SmallM<T> small_m = nullptr;
};

// Defined in gemm_avx2.cc (x86-64-v3) and gemm_avx512.cc (-mavx512f).
const IsaImpl<float>& avx2_f32();
const IsaImpl<float>& avx512_f32();
const IsaImpl<double>& avx2_f64();
// gemm_small_m_avx512.cc.
void small_m_f32_avx512(const GemmArgsT<float>& g, int64_t j_begin, int64_t j_end);

// Packers (gemm_pack.cc, x86-64-v3), explicitly instantiated for the tile
// shapes in use.
template <int MR>
void pack_a_f32(const float* src, int64_t rs, int64_t cs, int64_t rows, int64_t klen, float* dst);
template <int NR>
void pack_b_f32(const float* src, int64_t rs, int64_t cs, int64_t klen, int64_t cols, float* dst);
template <int MR>
void pack_a_f64(const double* src, int64_t rs, int64_t cs, int64_t rows, int64_t klen, double* dst);
template <int NR>
void pack_b_f64(const double* src, int64_t rs, int64_t cs, int64_t klen, int64_t cols, double* dst);

}  // namespace tessel::kernels::cpu::gemm_detail
