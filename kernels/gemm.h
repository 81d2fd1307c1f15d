#pragma once
// General matrix multiply with the canonical K-order (docs/design.md §4, level 3).
//
//   C[i,j] (+)= sum_k A[i,k] * B[k,j]
//
// The arithmetic of every output element is fixed by (K, V) alone:
//   * K is split into V chunks (numerics::chunk_begin/chunk_end: chunk c covers
//     [c*ceil(K/V), min((c+1)*ceil(K/V), K)), trailing chunks short or empty);
//   * chunk c: acc = +0; for k ascending: acc = fma(A[i,k], B[k,j], acc)
//     (one fused multiply-add per k, never reassociated; empty chunk -> +0);
//   * the V chunk results are combined by a balanced binary tree,
//     tree(lo, hi) = tree(lo, mid) + tree(mid, hi), left + right;
//   * accumulate: C = C_old + tree; otherwise C = tree.
// Consequences (all tested bit for bit in test/test_gemm.cc): the optimized
// kernel equals gemm_reference_*; a sub-block of C computed on its own equals
// the same block of the full product; the thread count and the instruction set
// (AVX2 or AVX-512) never change a bit; and splitting K into W power-of-two
// pieces of V/W chunks each, then finishing the tree, equals the unsplit GEMM
// when the chunk boundaries line up (K divisible by V) -- which is what lets a
// K-sharded matmul all-reduce to the single-device bits.
//
// Operands are strided views, so transposes are free: element (i,k) of A is
// A[i*a_row_stride + k*a_col_stride] and element (k,j) of B is
// B[k*b_row_stride + j*b_col_stride]. C is row-major with unit column stride.
// C must not overlap A or B.
#include <cstdint>

namespace tessel::kernels::cpu {

template <class T>
struct GemmArgsT {
  int64_t M = 0, N = 0, K = 0;
  const T* A = nullptr;
  int64_t a_row_stride = 0, a_col_stride = 1;  // element (i,k) at A[i*a_row_stride + k*a_col_stride]
  const T* B = nullptr;
  int64_t b_row_stride = 0, b_col_stride = 1;  // element (k,j) at B[k*b_row_stride + j*b_col_stride]
  T* C = nullptr;
  int64_t c_row_stride = 0;                    // element (i,j) at C[i*c_row_stride + j]
  bool accumulate = false;                     // C = C_old + A*B instead of C = A*B
  int chunks = 16;                             // V: a power of two in [1, 1024]
};
using GemmArgs = GemmArgsT<float>;
using GemmArgsF64 = GemmArgsT<double>;

// Optimized, multithreaded (tessel::parallel_for over blocks of C).
void gemm_f32(const GemmArgs& args);
void gemm_f64(const GemmArgsF64& args);

// `batch` independent GEMMs; problem b uses A + b*a_batch_stride,
// B + b*b_batch_stride, C + b*c_batch_stride (strides in elements; a zero
// stride broadcasts an operand). Parallel over batch and blocks of C together.
void gemm_batched_f32(const GemmArgs& args, int64_t batch, int64_t a_batch_stride, int64_t b_batch_stride,
                      int64_t c_batch_stride);
void gemm_batched_f64(const GemmArgsF64& args, int64_t batch, int64_t a_batch_stride, int64_t b_batch_stride,
                      int64_t c_batch_stride);

// The definition, as plain loops (single-threaded; slow). The oracle for tests.
void gemm_reference_f32(const GemmArgs& args);
void gemm_reference_f64(const GemmArgsF64& args);

// Which float32 code path gemm_f32 uses. Auto picks AVX-512 when the CPU has
// AVX-512F, else AVX2; TESSEL_GEMM_ISA=avx2|avx512 sets the initial choice.
// Every path produces the same bits; forcing one exists for tests and benches.
enum class GemmIsa { Auto, Avx2, Avx512 };
// Forces a path (Auto restores the default). Forcing Avx512 on a CPU without
// it throws. Returns the previous setting. Not for use concurrently with GEMMs.
GemmIsa gemm_force_isa(GemmIsa isa);
// The path gemm_f32 would take now (never Auto).
GemmIsa gemm_active_isa();
const char* gemm_isa_name(GemmIsa isa);

// Blocking limits, for tuning on a new machine and for tests that drive every
// code path with small shapes (0 / -1 = the path's tuned default; an explicit
// kc also turns off the single-block policy for K <= 2048). Results never
// depend on them. TESSEL_GEMM_BLOCKING="kc,mc,nc[,whole_k_pack_bytes]" sets
// the initial values. Returns the previous setting. Not for use concurrently
// with GEMMs.
struct GemmBlocking {
  int64_t kc = 0;                   // longest K block
  int64_t mc = 0, nc = 0;           // rows / columns of C per unit of work
  int64_t whole_k_pack_bytes = -1;  // B packed for all of K up to this size (0: never)
};
GemmBlocking gemm_set_blocking(const GemmBlocking& blocking);

}  // namespace tessel::kernels::cpu
