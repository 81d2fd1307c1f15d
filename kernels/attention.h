#pragma once
// Fused causal scaled-dot-product attention, forward and backward.
//
// Shapes: q [B, Hq, T, D], k and v [B, Hkv, T, D] (Hq a multiple of Hkv; query
// head h reads kv head h / g with g = Hq / Hkv), out [B, Hq, T, D]; any
// strides. Query i attends to keys j <= i. The kernels never touch a masked
// (i, j) pair.
//
// Order of operations (the contract a CUDA port reproduces bit for bit;
// docs/numerics.md "Fused causal attention"). C is the compute type: float for
// float16/bfloat16/float32 tensors (16-bit values widened on load, every
// output rounded once on store), double for float64. V = `chunks`.
// For one (b, h, i), with n = T (the global key/query length):
//
//   s_j   = fma-chain over d = 0..D-1 ascending of q_i[d] * k_j[d] from +0
//           (one FMA per d, no chunks: head_dim is never sharded), then
//           s_j = s_j * scale                                      (j <= i)
//   m     = max_{j<=i} s_j  (a value: any order; a zero max is +0; NaN if any s_j is NaN)
//   e_j   = tmath::exp(s_j - m)
//   l     = canonical_sum_V over the length-n row e_0..e_i, 0, ..., 0
//           (kernels/canonical.h: chunks of ceil(n/V), 8 lanes, lane tree, chunk tree)
//   p_j   = e_j * (C(1) / l)
//   p'_j  = dropout ? (keep(b,h,i,j) ? p_j * dscale : +0) : p_j
//   out_i[d] = chunked FMA sum over keys: chunk c of the length-n key range
//           (ceil(n/V) keys) gives acc = +0; acc = fma(p'_j, v_j[d], acc) for its
//           keys j <= i ascending (masked keys are left out; a chunk with none
//           is +0); the V chunk values are combined by the balanced tree.
//   Saved per row: stats = (m, l).
//
// Backward, with dO the output gradient:
//   p_j, p'_j recomputed as above from the saved (m, l) (same bits)
//   g_j   = fma-chain over d of dO_i[d] * v_j[d] from +0
//   dp_j  = dropout ? (keep ? g_j * dscale : +0) : g_j
//   Dl    = canonical_sum_V over the length-n row (dp_j * p_j for j <= i, +0 after)
//   ds_j  = (p_j * (dp_j - Dl)) * scale
//   dq_i[d]  = chunked FMA sum over keys j <= i of ds_j * k_j[d]        (chunks over n keys)
//   dk_j[d]  = chunked FMA sum over queries i >= j of ds_ij * q_i[d]   (chunks over n queries)
//   dv_j[d]  = chunked FMA sum over queries i >= j of p'_ij * dO_i[d]  (chunks over n queries)
//   for g > 1, dk and dv of kv head hk are the canonical sums (kernels/canonical.h,
//   V chunks over the g values) of those of query heads hk*g .. hk*g + g - 1,
//   taken in head order; for g = 1 they are the per-head values.
//
// keep(b,h,i,j) = (philox::bits_at(key, e) >> 8) < keep_threshold with e the
// row-major index of (b, h, i, j) in the global [B, Hq, T, T] probabilities
// placed by `block` -- exactly the mask `dropout` draws on the composite's
// probabilities (kernels/random.h).
//
// Every sum over keys or queries is the canonical one over the *global*
// length, so a split of keys or queries at chunk boundaries owns whole
// subtrees, and no result depends on tiles, threads or an element's position.
//
// A piece of the queries (context parallelism): q may hold Tq <= n rows, the
// global query rows q_begin .. q_begin + Tq - 1, while k and v hold all n keys
// (n = k's T). Row i above is then global row q_begin + (local row); out and
// stats have q's rows; dq is the piece's; dk and dv are the sums over the
// piece's queries only, with the other queries' chunks as +0 leaves of the
// same global tree: when the piece owns whole runs of the global chunks
// (dtensor::local_chunks), that is its subtree's root, and the pieces' sum in
// rank order by the collectives' tree is the one-device value. With g > 1 the
// group sum would come before that cross-piece sum, so context-parallel
// callers repeat k and v to g = 1 and sum the groups afterwards.
#include <cstdint>

#include "kernels/registry.h"
#include "runtime/global_block.h"
#include "runtime/philox.h"
#include "runtime/tensor.h"

namespace tessel::kernels {

struct AttentionParams {
  double scale = 1.0;
  int chunks = 16;                // V
  bool dropout = false;           // dropout on the probabilities
  PhiloxKey key{};
  uint32_t keep_threshold = 0;    // bernoulli_threshold(1 - p)
  double dropout_scale = 1.0;     // 1 / (1 - p) (0 when p == 1)
  GlobalBlock block;              // where the local [B, Hq, Tq, n] probabilities sit (empty: whole)
  int64_t q_begin = 0;            // global row of q's first row (a piece of the queries; see above)
};

// Compile mode (runtime/capture.h): how a recorded launch compares and
// re-keys its parameters.
inline void fingerprint(std::string& out, const AttentionParams& p) {
  using capture::fingerprint;
  fingerprint(out, p.scale);
  fingerprint(out, p.chunks);
  fingerprint(out, p.dropout);
  fingerprint(out, p.keep_threshold);
  fingerprint(out, p.dropout_scale);
  fingerprint(out, p.block);
  fingerprint(out, p.q_begin);
}
inline void for_each_key(AttentionParams& p, const std::function<void(PhiloxKey&)>& f) {
  if (p.dropout) f(p.key);
}
inline void for_each_block(AttentionParams& p, const std::function<void(GlobalBlock&)>& f) { f(p.block); }

// Global row-major index of local probability element (b, h, i, j).
struct AttentionDropoutIndex {
  uint64_t base = 0, sb = 0, sh = 0, si = 0;
  TESSEL_HOST_DEVICE_INLINE uint64_t operator()(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return base + uint64_t(b) * sb + uint64_t(h) * sh + uint64_t(i) * si + uint64_t(j);
  }
};
inline AttentionDropoutIndex attention_dropout_index(const GlobalBlock& block, int64_t B, int64_t H, int64_t T) {
  (void)B;  // the batch size does not enter a row-major index
  uint64_t gH = uint64_t(H), gTq = uint64_t(T), gTk = uint64_t(T);
  uint64_t ob = 0, oh = 0, oi = 0, oj = 0;
  if (!block.is_whole()) {
    gH = uint64_t(block.global_shape[1]);
    gTq = uint64_t(block.global_shape[2]), gTk = uint64_t(block.global_shape[3]);
    ob = uint64_t(block.offset[0]), oh = uint64_t(block.offset[1]);
    oi = uint64_t(block.offset[2]), oj = uint64_t(block.offset[3]);
  }
  AttentionDropoutIndex x;
  x.si = gTk;
  x.sh = gTq * gTk;
  x.sb = gH * gTq * gTk;
  x.base = ob * x.sb + oh * x.sh + oi * x.si + oj;
  return x;
}

// A piece of the queries must lie inside the keys' range, and its dropout
// coordinates come from the block (a whole block describes the whole square).
// Every device's kernels check this first.
inline void check_attention_piece(const char* op, const Tensor& q, const Tensor& k, const AttentionParams& p) {
  TESSEL_CHECK(p.q_begin >= 0 && p.q_begin + q.size(2) <= k.size(2), op,
               "query rows {}..{} (q {}) lie outside the {} keys of k {}", p.q_begin, p.q_begin + q.size(2),
               q.shape(), k.size(2), k.shape());
  TESSEL_CHECK(!p.dropout || !p.block.is_whole() || (p.q_begin == 0 && q.size(2) == k.size(2)), op,
               "dropout on a piece of the queries (q {} from row {}, k {}) needs the probabilities' block",
               q.shape(), p.q_begin, k.shape());
}

// out and stats ([B, Hq, Tq, 2] contiguous, compute dtype: (m, l) per row) are
// allocated by the caller; q, k, v, out share one floating dtype.
inline KernelTable<void(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p, const Tensor& out,
                        const Tensor& stats)>
    attention_forward{"attention_forward"};
// dq, dk, dv (shaped like q, k, v; any strides) from dout and the forward's stats.
inline KernelTable<void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout, const Tensor& stats,
                        const AttentionParams& p, const Tensor& dq, const Tensor& dk, const Tensor& dv)>
    attention_backward{"attention_backward"};

// Fast-mode fused causal attention (cuDNN's flash attention on the GPU,
// kernels/cuda/cudnn_attention.cc): the same function, not the order above
// (not bitwise, no dropout). lse: [B, Hq, T, 1] float32, contiguous, the
// row log-sum-exp of the scaled scores, which the backward reuses with `out`.
// Registered only where the library is available; `applies` says whether it
// takes this problem (dtype, head_dim).
struct FastAttentionShape {
  DType dtype;
  int64_t B, Hq, Hkv, T, D;
};
inline KernelTable<void(const FastAttentionShape& s, bool* applies)> attention_fast_applies{"attention_fast_applies"};
inline KernelTable<void(const Tensor& q, const Tensor& k, const Tensor& v, double scale, const Tensor& out,
                        const Tensor& lse)>
    attention_fast_forward{"attention_fast_forward"};
inline KernelTable<void(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& dout,
                        const Tensor& lse, double scale, const Tensor& dq, const Tensor& dk, const Tensor& dv)>
    attention_fast_backward{"attention_fast_backward"};

}  // namespace tessel::kernels
