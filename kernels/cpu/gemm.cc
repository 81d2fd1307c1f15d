// GEMM driver: blocking, threading and the canonical chunk tree (kernels/gemm.h).
//
// Structure (BLIS-like, reordered so the chunk tree stays local; docs/gemm.md):
//   * C is cut into units of whole MR x NR tiles (at most mc_max x nc_max).
//     Each unit is computed over all of K by one thread, so no reduction ever
//     crosses threads and the only live reduction state is the unit's tree
//     stacks. Units are ordered so that units sharing columns are adjacent;
//     each thread owns a contiguous range and steals from the others' ends.
//   * K is cut into blocks (make_plan): aligned power-of-two runs of whole
//     chunks up to kc_max long, or equal pieces of a chunk longer than that.
//   * B's panels (NR columns, k-major) are packed once for all of K per
//     column range and reused by the units below it. Per block the unit's A
//     rows are packed (MR-row panels, an L2-sized block); then for each NR
//     panel (outer) and MR panel (inner) the micro-kernel runs the block's
//     segments (the block's part of each chunk) for that tile.
//   * Each tile owns a small tree stack (log2 V slots + one partial-sum slot)
//     in a thread-local buffer laid out [slot][tile]; the kernel merges each
//     finished chunk into it and writes the root to C.
// None of this changes what is computed per element, only when.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/gemm.h"
#include "runtime/error.h"
#include "runtime/numerics.h"
#include "runtime/threadpool.h"

namespace tessel::kernels::cpu {
namespace gemm_detail {
namespace {

// ---------------------------------------------------------------------------
// K plan: segments (a k range inside one chunk) grouped into blocks.
// ---------------------------------------------------------------------------
struct Block {
  int64_t k0, klen;
  int seg_begin, seg_end;
};
struct Plan {
  std::vector<KSegment> segs;
  std::vector<Block> blocks;
  int levels = 0;
};

void make_plan(int64_t K, int V, int64_t kc_max, Plan* plan) {
  plan->segs.clear();
  plan->blocks.clear();
  plan->levels = 0;
  while ((1 << plan->levels) < V) ++plan->levels;
  // Short chunks are grouped in aligned power-of-two runs, so a block holds
  // whole subtrees: their merges stay in L1 and fewer slots live across
  // blocks. Chunks longer than kc_max are cut into equal pieces, one block
  // each, the FMA chain carried over in the partial-sum slot.
  const int64_t L = numerics::chunk_size(K, V);
  int per_block = 1;
  while (per_block < V && 2 * per_block * L <= kc_max) per_block *= 2;
  for (int c = 0; c < V; ++c) {
    const int64_t b = numerics::chunk_begin(K, V, c), e = numerics::chunk_end(K, V, c), len = e - b;
    const int64_t pieces = len == 0 ? 1 : (len + kc_max - 1) / kc_max;
    for (int64_t p = 0; p < pieces; ++p) {
      const int64_t p0 = b + len * p / pieces, p1 = b + len * (p + 1) / pieces;
      KSegment s{p0, p1 - p0, c, p == 0, p == pieces - 1};
      if (p > 0 || c % per_block == 0) {
        plan->blocks.push_back(Block{p0, 0, int(plan->segs.size()), int(plan->segs.size())});
      }
      Block& blk = plan->blocks.back();
      blk.klen += s.len;
      blk.seg_end++;
      plan->segs.push_back(s);
    }
  }
}

// ---------------------------------------------------------------------------
// Thread-local, grow-only, 64-byte aligned scratch.
// ---------------------------------------------------------------------------
class Scratch {
 public:
  ~Scratch() { std::free(data_); }
  template <class T>
  T* get(size_t n) {
    size_t bytes = n * sizeof(T);
    if (bytes > cap_) {
      std::free(data_);
      cap_ = (bytes + 4095) & ~size_t(4095);
      data_ = std::aligned_alloc(64, cap_);
      if (!data_) {
        cap_ = 0;
        throw std::bad_alloc();
      }
    }
    return static_cast<T*>(data_);
  }

 private:
  void* data_ = nullptr;
  size_t cap_ = 0;
};

struct ThreadScratch {
  Scratch a, b, stack;
};
ThreadScratch& thread_scratch() {
  thread_local ThreadScratch s;
  return s;
}

// A range of unit indices [front, back) taken from the front by its owner
// and from the back by thieves; both ends live in one atomic word.
struct alignas(64) UnitRange {
  std::atomic<uint64_t> ends{0};
  void reset(int64_t front, int64_t back) { ends.store(pack(front, back)); }
  int64_t take_front() {
    uint64_t v = ends.load();
    for (;;) {
      const int64_t f = int64_t(v & 0xffffffffu), b = int64_t(v >> 32);
      if (f >= b) return -1;
      if (ends.compare_exchange_weak(v, pack(f + 1, b))) return f;
    }
  }
  int64_t take_back() {
    uint64_t v = ends.load();
    for (;;) {
      const int64_t f = int64_t(v & 0xffffffffu), b = int64_t(v >> 32);
      if (f >= b) return -1;
      if (ends.compare_exchange_weak(v, pack(f, b - 1))) return b - 1;
    }
  }
  static uint64_t pack(int64_t front, int64_t back) { return uint64_t(front) | (uint64_t(back) << 32); }
};

// ---------------------------------------------------------------------------
// Unit grid.
// ---------------------------------------------------------------------------
struct Grid {
  int64_t mtiles, ntiles;  // tiles of C
  int64_t gm, gn;          // units along M and N
  int64_t unit_rows_max, unit_cols_max;
};

Grid make_grid(int64_t M, int64_t N, int64_t batch, int mr, int nr, int64_t mc_max, int64_t nc_max, int threads) {
  Grid g;
  g.mtiles = (M + mr - 1) / mr;
  g.ntiles = (N + nr - 1) / nr;
  const int64_t mt_max = std::max<int64_t>(1, mc_max / mr), nt_max = std::max<int64_t>(1, nc_max / nr);
  g.gm = std::max<int64_t>(1, (g.mtiles + mt_max - 1) / mt_max);
  g.gn = std::max<int64_t>(1, (g.ntiles + nt_max - 1) / nt_max);
  // Enough units to keep every thread busy even when one starts late (a
  // thread waking on a busy machine can lag by milliseconds; the others then
  // take its units): split the longer side until there are 4 per thread,
  // but not below 4 x 2 tiles per unit.
  for (;;) {
    const int64_t units = batch * g.gm * g.gn;
    if (threads <= 1 || units >= 4 * threads) break;
    const int64_t tm = (g.mtiles + g.gm - 1) / g.gm, tn = (g.ntiles + g.gn - 1) / g.gn;
    const bool can_m = tm >= 8, can_n = tn >= 4;
    if (!can_m && !can_n) break;
    if (can_m && (tm * mr >= tn * nr || !can_n)) {
      g.gm++;
    } else {
      g.gn++;
    }
  }
  g.unit_rows_max = (g.mtiles + g.gm - 1) / g.gm * mr;
  g.unit_cols_max = (g.ntiles + g.gn - 1) / g.gn * nr;
  return g;
}

// ---------------------------------------------------------------------------
// One unit: rows [i0, i0+rows), columns [j0, j0+cols) of C, all of K.
// ---------------------------------------------------------------------------
// B's packed panels: when `b_packed` is set they were packed for all of K
// (block b at b_packed + blk.k0 * padded cols); else each block is packed
// into bpack here.
template <class T>
void run_unit(const IsaImpl<T>& isa, const GemmArgsT<T>& g, const Plan& plan, int64_t i0, int64_t rows, int64_t j0,
              int64_t cols, T* apack, const T* b_packed, T* bpack, T* stack) {
  const int MR = isa.mr, NR = isa.nr;
  const int64_t mtl = (rows + MR - 1) / MR, ntl = (cols + NR - 1) / NR;
  const int64_t tile_elems = int64_t(MR) * NR;
  const int64_t slot_stride = mtl * ntl * tile_elems;
  // With a single K block a tile's whole tree is built inside one kernel
  // call (no chunk is split), so every tile can share one small stack
  // (always in L1) and no partial sums exist.
  const bool one_block = plan.blocks.size() == 1;
  T* partial_slot = one_block ? nullptr : stack + plan.levels * slot_stride;

  TileJob<T> job;
  job.slot_stride = one_block ? tile_elems : slot_stride;
  job.levels = plan.levels;
  job.ldc = g.c_row_stride;
  job.accumulate = g.accumulate;

  for (const Block& blk : plan.blocks) {
    job.segs = plan.segs.data() + blk.seg_begin;
    job.nsegs = blk.seg_end - blk.seg_begin;
    const T* bblock = b_packed ? b_packed + blk.k0 * ntl * NR : bpack;
    if (blk.klen > 0) {
      isa.pack_a(g.A + i0 * g.a_row_stride + blk.k0 * g.a_col_stride, g.a_row_stride, g.a_col_stride, rows,
                 blk.klen, apack);
      if (!b_packed)
        isa.pack_b(g.B + blk.k0 * g.b_row_stride + j0 * g.b_col_stride, g.b_row_stride, g.b_col_stride, blk.klen,
                   cols, bpack);
    }
    for (int64_t jt = 0; jt < ntl; ++jt) {
      const T* bp = bblock + jt * blk.klen * NR;
      job.nr = int(std::min<int64_t>(NR, cols - jt * NR));
      for (int64_t it = 0; it < mtl; ++it) {
        const T* ap = apack + it * blk.klen * MR;
        const int64_t tile = jt * mtl + it;
        job.partial = one_block ? nullptr : partial_slot + tile * tile_elems;
        job.stack = one_block ? stack : stack + tile * tile_elems;
        job.c = g.C + (i0 + it * MR) * g.c_row_stride + j0 + jt * NR;
        job.mr = int(std::min<int64_t>(MR, rows - it * MR));
        isa.kernel(ap, bp, job);
      }
    }
  }
}

template <class T>
void check_args(const char* op, const GemmArgsT<T>& g) {
  TESSEL_CHECK(g.M >= 0 && g.N >= 0 && g.K >= 0, op, "negative size M={} N={} K={}", g.M, g.N, g.K);
  TESSEL_CHECK(g.chunks >= 1 && g.chunks <= 1024 && (g.chunks & (g.chunks - 1)) == 0, op,
               "chunks (V) must be a power of two in [1, 1024], got {}", g.chunks);
  TESSEL_CHECK(g.M == 0 || g.N == 0 || g.C != nullptr, op, "C is null (M={} N={})", g.M, g.N);
  TESSEL_CHECK(g.M == 0 || g.N == 0 || g.K == 0 || (g.A != nullptr && g.B != nullptr), op,
               "A or B is null (M={} N={} K={})", g.M, g.N, g.K);
}

// A few rows of C against a B that is unit-stride along k or j: no packing,
// B read once (gemm_small_m_avx512.cc); columns in groups of 16 spread over
// the threads. Same bits as the packed path.
template <class T>
bool run_small_m(const IsaImpl<T>& isa, const GemmArgsT<T>& args, int64_t batch, int64_t a_bs, int64_t b_bs,
                 int64_t c_bs) {
  if (!isa.small_m || args.M > kSmallM || args.K == 0 || (args.b_row_stride != 1 && args.b_col_stride != 1))
    return false;
  constexpr int64_t G = 16;
  const int64_t groups = (args.N + G - 1) / G;
  // At least ~64k FMAs per task, so tiny products stay on one thread.
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(1, args.M * G * args.K));
  parallel_for(batch * groups, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1;) {
      const int64_t bi = p / groups, first = p % groups, last = std::min(groups, first + (p1 - p));
      GemmArgsT<T> g = args;
      g.A += bi * a_bs;
      g.B += bi * b_bs;
      g.C += bi * c_bs;
      isa.small_m(g, first * G, std::min(args.N, last * G));
      p += last - first;
    }
  });
  return true;
}

template <class T>
void gemm_driver(const IsaImpl<T>& isa, const GemmArgsT<T>& args, int64_t batch, int64_t a_bs, int64_t b_bs,
                 int64_t c_bs) {
  if (args.M == 0 || args.N == 0 || batch == 0) return;
  if (run_small_m(isa, args, batch, a_bs, b_bs, c_bs)) return;
  // Up to one_block_k_max, all of K is one block: each kernel call builds a
  // tile's whole tree (its stack stays in L1, no tree state outlives the
  // call), and units get fewer rows so the unit's A block still fits L2.
  const bool one_block = args.K <= isa.one_block_k_max;
  const int64_t chunk_len = numerics::chunk_size(args.K, args.chunks);
  const int64_t kc_max = one_block ? std::max<int64_t>(1, chunk_len * args.chunks) : isa.kc_max;
  const int64_t mc_max =
      one_block ? std::clamp<int64_t>(isa.a_block_bytes / std::max<int64_t>(1, args.K * int64_t(sizeof(T))) / isa.mr *
                                          isa.mr,
                                      isa.mr, isa.mc_max)
                : isa.mc_max;
  thread_local Plan plan;
  make_plan(args.K, args.chunks, kc_max, &plan);
  const int threads = num_threads();
  // Wider units re-pack A fewer times; but B is packed for all of K per
  // column range, so for long K the units narrow to keep that pack within
  // its budget (down to nc_min, below which B is packed per block instead).
  const int64_t nc_fit = isa.whole_k_pack_bytes / std::max<int64_t>(1, args.K * int64_t(sizeof(T)));
  const int64_t nc = std::max(std::min(isa.nc_min, isa.nc_max), std::min(isa.nc_max, nc_fit / isa.nr * isa.nr));
  const Grid grid = make_grid(args.M, args.N, batch, isa.mr, isa.nr, mc_max, nc, threads);
  const int64_t units_per_gemm = grid.gm * grid.gn;
  int64_t kc = 1;  // longest block
  for (const Block& blk : plan.blocks) kc = std::max(kc, blk.klen);
  const int64_t apack_elems = grid.unit_rows_max * kc + kPackSlack;
  // Units that share columns run one after another on a thread, so B's
  // panels for all of K are packed once per column range and re-read
  // sequentially (unless that is too much memory; then per block per unit).
  const bool b_whole_k = args.K * grid.unit_cols_max * int64_t(sizeof(T)) <= isa.whole_k_pack_bytes;
  const int64_t bpack_elems = (b_whole_k ? args.K : kc) * grid.unit_cols_max + kPackSlack;
  // Tree stacks: one per tile of a unit, or one shared by all with one block.
  const int64_t stack_elems = (plan.levels + 1) * (plan.blocks.size() == 1 ? int64_t(isa.mr) * isa.nr
                                                                            : grid.unit_rows_max * grid.unit_cols_max);
  const Plan& p = plan;  // the caller's plan, read by all workers

  // Each thread owns a contiguous range of units (so it packs B for few
  // column ranges) and, when done, steals units from the back of the others'
  // ranges (so a thread slowed by anything else on the machine takes fewer).
  // Which thread computes a unit never matters to the result.
  const int64_t total = batch * units_per_gemm;
  TESSEL_CHECK(total < (int64_t(1) << 31), "gemm", "too many blocks of C ({} x {} x batch {})", args.M, args.N, batch);
  const int parts = int(std::min<int64_t>(total, threads));
  thread_local std::vector<UnitRange> ranges_storage;
  if (ranges_storage.size() < size_t(parts)) ranges_storage = std::vector<UnitRange>(parts);
  UnitRange* ranges = ranges_storage.data();
  for (int i = 0; i < parts; ++i) ranges[i].reset(total * i / parts, total * (i + 1) / parts);

  parallel_for(parts, 1, [&](int64_t p0, int64_t p1) {
    ThreadScratch& ts = thread_scratch();
    T* apack = ts.a.get<T>(apack_elems);
    T* bpack = ts.b.get<T>(bpack_elems);
    T* stack = ts.stack.get<T>(stack_elems);
    int64_t packed_b_key = -1;  // (batch entry, column range) whose B is in bpack
    int64_t own = p0, victim = 0;
    for (;;) {
      int64_t u = -1;
      while (own < p1 && (u = ranges[own].take_front()) < 0) ++own;
      while (u < 0 && victim < parts) {
        if ((u = ranges[(p1 + victim) % parts].take_back()) < 0) ++victim;
      }
      if (u < 0) break;
      const int64_t bi = u / units_per_gemm, r = u % units_per_gemm;
      // Consecutive units share the column range (and so the B columns).
      const int64_t un = r / grid.gm, um = r % grid.gm;
      const int64_t t0 = grid.mtiles * um / grid.gm, t1 = grid.mtiles * (um + 1) / grid.gm;
      const int64_t s0 = grid.ntiles * un / grid.gn, s1 = grid.ntiles * (un + 1) / grid.gn;
      const int64_t i0 = t0 * isa.mr, rows = std::min(t1 * isa.mr, args.M) - i0;
      const int64_t j0 = s0 * isa.nr, cols = std::min(s1 * isa.nr, args.N) - j0;
      if (rows <= 0 || cols <= 0) continue;
      GemmArgsT<T> g = args;
      g.A += bi * a_bs;
      g.B += bi * b_bs;
      g.C += bi * c_bs;
      if (b_whole_k) {
        const int64_t key = (b_bs == 0 ? 0 : bi) * grid.gn + un;  // a broadcast B is packed once
        if (key != packed_b_key) {
          const int64_t cols_padded = (cols + isa.nr - 1) / isa.nr * isa.nr;
          for (const Block& blk : p.blocks)
            if (blk.klen > 0)
              isa.pack_b(g.B + blk.k0 * g.b_row_stride + j0 * g.b_col_stride, g.b_row_stride, g.b_col_stride,
                         blk.klen, cols, bpack + blk.k0 * cols_padded);
          packed_b_key = key;
        }
      }
      run_unit(isa, g, p, i0, rows, j0, cols, apack, b_whole_k ? bpack : nullptr, bpack, stack);
    }
  });
}

// ---------------------------------------------------------------------------
// ISA selection.
// ---------------------------------------------------------------------------
bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has;
}

GemmIsa initial_isa() {
  if (const char* env = std::getenv("TESSEL_GEMM_ISA")) {
    std::string s(env);
    if (s == "avx2") return GemmIsa::Avx2;
    if (s == "avx512") return GemmIsa::Avx512;
    TESSEL_CHECK(s == "auto" || s.empty(), "TESSEL_GEMM_ISA", "expected avx2, avx512 or auto, got '{}'", s);
  }
  return GemmIsa::Auto;
}

std::atomic<GemmIsa>& forced_isa() {
  static std::atomic<GemmIsa> isa{initial_isa()};
  return isa;
}

// Blocking overrides (gemm_set_blocking; TESSEL_GEMM_BLOCKING="kc,mc,nc").
GemmBlocking initial_blocking() {
  GemmBlocking b;
  if (const char* env = std::getenv("TESSEL_GEMM_BLOCKING")) {
    long long kc = 0, mc = 0, nc = 0, whole_k = -1;
    const int n = std::sscanf(env, "%lld,%lld,%lld,%lld", &kc, &mc, &nc, &whole_k);
    TESSEL_CHECK((n == 3 || n == 4) && kc >= 0 && mc >= 0 && nc >= 0, "TESSEL_GEMM_BLOCKING",
                 "expected kc,mc,nc[,whole_k_pack_bytes] (0 = default), got '{}'", env);
    b.kc = kc, b.mc = mc, b.nc = nc, b.whole_k_pack_bytes = whole_k;
  }
  return b;
}

GemmBlocking& blocking_override() {
  static GemmBlocking b = initial_blocking();
  return b;
}

template <class T>
IsaImpl<T> with_overrides(IsaImpl<T> impl) {
  const GemmBlocking& b = blocking_override();
  if (b.kc > 0) impl.kc_max = b.kc, impl.one_block_k_max = 0;  // explicit K blocks
  if (b.mc > 0) impl.mc_max = std::max<int64_t>(impl.mr, b.mc / impl.mr * impl.mr);
  if (b.nc > 0) impl.nc_max = impl.nc_min = std::max<int64_t>(impl.nr, b.nc / impl.nr * impl.nr);
  if (b.whole_k_pack_bytes >= 0) impl.whole_k_pack_bytes = b.whole_k_pack_bytes;
  return impl;
}

IsaImpl<float> f32_impl() {
  return with_overrides(gemm_active_isa() == GemmIsa::Avx512 ? avx512_f32() : avx2_f32());
}

IsaImpl<double> f64_impl() { return with_overrides(avx2_f64()); }

// ---------------------------------------------------------------------------
// The definition.
// ---------------------------------------------------------------------------
template <class T>
void reference(const GemmArgsT<T>& g) {
  const int V = g.chunks;
  std::vector<T> part(V);
  for (int64_t i = 0; i < g.M; ++i) {
    for (int64_t j = 0; j < g.N; ++j) {
      for (int c = 0; c < V; ++c) {
        T acc = T(0);
        for (int64_t k = numerics::chunk_begin(g.K, V, c); k < numerics::chunk_end(g.K, V, c); ++k)
          acc = std::fma(g.A[i * g.a_row_stride + k * g.a_col_stride], g.B[k * g.b_row_stride + j * g.b_col_stride],
                         acc);
        part[c] = acc;
      }
      for (int w = 1; w < V; w *= 2)
        for (int c = 0; c + w < V; c += 2 * w) part[c] = part[c] + part[c + w];
      T& out = g.C[i * g.c_row_stride + j];
      out = g.accumulate ? out + part[0] : part[0];
    }
  }
}

}  // namespace
}  // namespace gemm_detail

using namespace gemm_detail;

GemmIsa gemm_force_isa(GemmIsa isa) {
  TESSEL_CHECK(isa != GemmIsa::Avx512 || cpu_has_avx512(), "gemm_force_isa", "this CPU has no AVX-512F");
  return forced_isa().exchange(isa);
}

GemmBlocking gemm_set_blocking(const GemmBlocking& b) {
  TESSEL_CHECK(b.kc >= 0 && b.mc >= 0 && b.nc >= 0, "gemm_set_blocking", "negative limit kc={} mc={} nc={}", b.kc,
               b.mc, b.nc);
  GemmBlocking prev = blocking_override();
  blocking_override() = b;
  return prev;
}

GemmIsa gemm_active_isa() {
  GemmIsa f = forced_isa().load(std::memory_order_relaxed);
  if (f == GemmIsa::Avx512 && cpu_has_avx512()) return GemmIsa::Avx512;
  if (f == GemmIsa::Avx2) return GemmIsa::Avx2;
  return cpu_has_avx512() ? GemmIsa::Avx512 : GemmIsa::Avx2;
}

const char* gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::Auto: return "auto";
    case GemmIsa::Avx2: return "avx2";
    case GemmIsa::Avx512: return "avx512";
  }
  return "?";
}

void gemm_f32(const GemmArgs& args) {
  check_args("gemm_f32", args);
  gemm_driver(f32_impl(), args, 1, 0, 0, 0);
}

void gemm_f64(const GemmArgsF64& args) {
  check_args("gemm_f64", args);
  gemm_driver(f64_impl(), args, 1, 0, 0, 0);
}

void gemm_batched_f32(const GemmArgs& args, int64_t batch, int64_t a_batch_stride, int64_t b_batch_stride,
                      int64_t c_batch_stride) {
  check_args("gemm_batched_f32", args);
  TESSEL_CHECK(batch >= 0, "gemm_batched_f32", "negative batch {}", batch);
  gemm_driver(f32_impl(), args, batch, a_batch_stride, b_batch_stride, c_batch_stride);
}

void gemm_batched_f64(const GemmArgsF64& args, int64_t batch, int64_t a_batch_stride, int64_t b_batch_stride,
                      int64_t c_batch_stride) {
  check_args("gemm_batched_f64", args);
  TESSEL_CHECK(batch >= 0, "gemm_batched_f64", "negative batch {}", batch);
  gemm_driver(f64_impl(), args, batch, a_batch_stride, b_batch_stride, c_batch_stride);
}

void gemm_reference_f32(const GemmArgs& args) {
  check_args("gemm_reference_f32", args);
  reference(args);
}

void gemm_reference_f64(const GemmArgsF64& args) {
  check_args("gemm_reference_f64", args);
  reference(args);
}

}  // namespace tessel::kernels::cpu
