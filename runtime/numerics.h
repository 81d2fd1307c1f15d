#pragma once
// The numerics contract's knobs (docs/design.md §4, docs/numerics.md).
//
// Canonical reductions: a reduction of length n is split into V contiguous
// chunks of ceil(n / V) elements (trailing chunks may be short or empty).
// Each chunk is reduced in a fixed order (see kernels/canonical.h), and the V
// chunk results are combined by a balanced binary tree:
//   ((c0 + c1) + (c2 + c3)) + ((c4 + c5) + (c6 + c7)) ...
// V is a power of two. Any power-of-two split of the reduced dimension that
// divides V and cuts it at chunk boundaries owns whole subtrees, so a sharded
// or micro-batched computation can finish the same tree and get the same bits.
#include <cstdint>
#include <string>

#include "runtime/macros.h"

namespace tessel {
namespace numerics {

// V for every canonical reduction (default 16; TESSEL_REDUCE_CHUNKS).
int reduction_chunks();
// Sets V (must be a power of two in [1, 1024]); returns the previous value.
int set_reduction_chunks(int v);

// RAII: use V within a scope (tests, benchmarks).
class ChunksGuard {
 public:
  explicit ChunksGuard(int v) : prev_(set_reduction_chunks(v)) {}
  ~ChunksGuard() { set_reduction_chunks(prev_); }
  ChunksGuard(const ChunksGuard&) = delete;
  ChunksGuard& operator=(const ChunksGuard&) = delete;

 private:
  int prev_;
};

// Bitwise mode (docs/design.md §4 levels 2-3 for distributed runs): a computation
// on any mesh, split into any micro-batches, gives the bits of the
// single-device computation. Sharded reductions then keep the canonical tree
// (each piece computes its subtree, the collectives finish it) or gather;
// pending sums never flow through inexact arithmetic. Per thread (ranks
// running as threads set their own), default off (TESSEL_BITWISE=1 turns it
// on); see docs/numerics.md.
bool bitwise();
bool set_bitwise(bool on);  // returns the previous setting

class BitwiseGuard {
 public:
  explicit BitwiseGuard(bool on) : prev_(set_bitwise(on)) {}
  ~BitwiseGuard() { set_bitwise(prev_); }
  BitwiseGuard(const BitwiseGuard&) = delete;
  BitwiseGuard& operator=(const BitwiseGuard&) = delete;

 private:
  bool prev_;
};

// Chunk geometry: chunk c of a length-n reduction covers [begin, end).
TESSEL_HOST_DEVICE_INLINE int64_t chunk_size(int64_t n, int v) { return (n + v - 1) / v; }
TESSEL_HOST_DEVICE_INLINE int64_t chunk_begin(int64_t n, int v, int c) {
  int64_t b = chunk_size(n, v) * c;
  return b < n ? b : n;
}
TESSEL_HOST_DEVICE_INLINE int64_t chunk_end(int64_t n, int v, int c) { return chunk_begin(n, v, c + 1); }

// Lanes inside a chunk for elementwise-sum reductions (kernels/canonical.h).
inline constexpr int kLanes = 8;

// Which GEMM a matmul on a GPU uses (docs/cuda.md). CPU matmuls always follow
// the canonical K-order; the mode only changes what CUDA does:
//   Bitwise: tessel's own GEMM in the canonical K-order (docs/gemm.md): the
//            same bits as the CPU for float32 (docs/design.md §4 level 4).
//   Fast:    cuBLASLt (tensor cores for bfloat16/float16, float32 accumulate)
//            with one algorithm fixed per problem shape and no split-K
//            atomics: run-to-run deterministic (levels 1 and 2), not
//            shard-invariant and not equal to the CPU.
// Default Bitwise; TESSEL_GEMM=bitwise|fast sets the initial value.
enum class GemmMode : uint8_t { Bitwise, Fast };
GemmMode gemm_mode();
// Returns the previous mode.
GemmMode set_gemm_mode(GemmMode mode);
const char* gemm_mode_name(GemmMode mode);
// Parses "bitwise" / "fast"; throws tessel::Error naming `what` otherwise.
GemmMode parse_gemm_mode(const char* text, const char* what);

class GemmModeGuard {
 public:
  explicit GemmModeGuard(GemmMode m) : prev_(set_gemm_mode(m)) {}
  ~GemmModeGuard() { set_gemm_mode(prev_); }
  GemmModeGuard(const GemmModeGuard&) = delete;
  GemmModeGuard& operator=(const GemmModeGuard&) = delete;

 private:
  GemmMode prev_;
};

// The build the numerics contract needs: no floating-point contraction
// (-ffp-contract=off; GCC's default is "fast", which fuses a * b + c into one
// FMA wherever the target has FMA, e.g. -march=x86-64-v3 or native). With
// contraction the canonical orders still hold but an element's arithmetic is
// no longer the contract's, so no two builds or devices agree bit for bit.
// Whether `mul_add` (a function computing a * b + c on floats, compiled with
// the flags in question) fuses:
bool fuses_multiply_add(float (*mul_add)(float, float, float));
// Throws tessel::Error naming `who` when tessel itself was compiled with
// contraction (bitwise mode and tessel::parallelize call it).
void check_no_contraction(const char* who);

// Every knob above as one value: what a rank computes with. Ranks must agree
// on it: comm::run_local gives each rank thread its caller's settings, and
// every collective compares the callers' settings across ranks (comm/backend.h
// Meta), so ranks that disagree fail at their first collective with an error
// naming both settings instead of silently computing other bits.
struct Settings {
  bool bitwise = false;
  int reduction_chunks = 16;
  GemmMode gemm = GemmMode::Bitwise;
  bool operator==(const Settings& o) const {
    return bitwise == o.bitwise && reduction_chunks == o.reduction_chunks && gemm == o.gemm;
  }
  bool operator!=(const Settings& o) const { return !(*this == o); }
};
// This thread's settings.
Settings current_settings();
// Sets them: bitwise for this thread; V and the GEMM mode are process-wide.
void apply_settings(const Settings& s);
// Packed into 32 bits for the collectives' cross-rank check, and back.
uint32_t encode_settings(const Settings& s);
Settings decode_settings(uint32_t bits);
// "bitwise mode on, V = 16, GEMM bitwise"
std::string describe_settings(const Settings& s);

}  // namespace numerics
}  // namespace tessel
