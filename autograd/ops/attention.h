#pragma once
// Scaled dot-product attention.
#include <optional>

#include "runtime/global_block.h"
#include "runtime/philox.h"
#include "runtime/tensor.h"

namespace tessel {

struct AttentionOptions {
  bool causal = true;           // query i attends to keys j <= i (needs T_q == T_k)
  std::optional<double> scale;  // default 1/sqrt(head_dim)
  double dropout_p = 0.0;       // dropout on the attention probabilities
  PhiloxKey dropout_key{};      // required when dropout_p > 0
  GlobalBlock dropout_block;    // where the [B, H, Tq, Tk] probabilities sit in the global ones (empty: whole)
  Tensor mask;                  // optional bool mask broadcastable to [B, H, T_q, T_k]; true = attend
  bool fused = true;            // use the fused causal kernel where it applies (false: always the composite)
};

// q: [B, Hq, Tq, D], k and v: [B, Hkv, Tk, D] with Hq a multiple of Hkv
// (grouped-query attention: query head h reads kv head h / (Hq / Hkv)).
// Returns [B, Hq, Tq, D].
//
// Two implementations, each with its own fixed order of operations:
// - fused (causal, no mask, q/k/v of one floating dtype, a device with the
//   kernel -- CPU): one op that never computes the masked half, keeps only a
//   (max, sum) pair per query row for backward, and follows the order written
//   in kernels/attention.h (docs/numerics.md "Fused causal attention"). Its
//   output has q's memory layout (a transposed view when q is one), its
//   gradients those of q, k, v.
// - composite (everything else, or opts.fused = false): matmul, scale,
//   masked_fill, softmax, dropout, matmul -- each op's own canonical order.
// The two agree to rounding, not bit for bit. Dropout draws the same mask in
// both: element (b, h, i, j) of the [B, Hq, Tq, Tk] probabilities at its
// global coordinates (dropout_block).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& opts = {});

// Context parallelism (docs/parallel.md "Context parallelism"): queries cut
// along time (dim 2) over a mesh dim. The fused causal attention keeps them
// cut and gathers k and v ("local"; "balanced" when each rank computes
// segments r and 2W-1-r of 2W, exchanging query and output rows); everything else -- an explicit mask,
// non-causal attention, the composite, cuts not on the canonical chunks in
// bitwise mode, the GPU's kernels -- gathers the time dim ("gathered": the
// right result, without the memory saving); "whole": distributed queries
// that arrived not cut along time (an earlier op gathered it: in bitwise
// mode the linear layers do, so that their weight gradients keep the
// one-device order, when the ranks' pieces are not consecutive whole runs of
// the canonical chunks -- several sequences per rank, a cp dim before dp, or
// a sequence length whose pieces do not fall on the chunks).
// Counted per thread since it started, so a run on a cp mesh can tell
// whether it got what it asked for.
struct ContextParallelAttentionCount {
  int64_t local = 0;
  int64_t gathered = 0;
  int64_t whole = 0;
  int64_t balanced = 0;  // of `local`: with causal load balancing (2 segments per rank)
};
ContextParallelAttentionCount context_parallel_attention_count();

// Whether a sequence of seq_len positions splits into the 2 cp equal segments
// of load-balanced context-parallel attention -- in bitwise mode (`bitwise`,
// V = `chunks`) also each an aligned run of V / 2cp canonical chunks, so that
// its sums over queries finish the one-device tree. The trainer checks it
// before any work; attention falls back to contiguous pieces without it.
bool balanced_segments_fit(int64_t seq_len, int64_t cp, bool bitwise, int chunks);

// Load-balanced context-parallel attention gathers k and v whole one group of
// kv heads at a time (docs/parallel.md "Context parallelism"), each group at
// most this many bytes of k and v where the heads allow (default 16 MiB; one
// head per group at the least). Sets it for every thread and returns the
// previous value (tests use a small one to stream head by head).
int64_t set_context_parallel_group_bytes(int64_t bytes);

}  // namespace tessel
