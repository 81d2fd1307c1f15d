#pragma once
// Counting what a step costs, the same way for a real run and for a run on
// the Meta device (no memory, no kernels, no communication): the planner
// (planner/) predicts a layout's costs by running a step of it on Meta, and
// tests check the prediction against a real run's counts.
//
//   cost::CountScope counting;          // this thread, until the scope ends
//   ... forward, backward ...
//   counting.counts().flops()           // GEMM + attention FLOPs this thread's ops ran
//   counting.counts().comm_bytes        // bytes each collective kind moved (redistributions)
//   counting.meta_peak_bytes()          // Meta storages: the most alive at once
//
// What is counted, at the op level (both devices take the same path):
//   * GEMMs: 2 M N K per product (kernels::bmm calls: matmul, linear and
//     their gradients);
//   * fused attention: 4 D per (query, visible key) pair forward (q k^T and
//     p v), 8 D backward (recomputed scores, dp, dq, dk and dv products);
//   * redistributions (dtensor::redistribute_local): per step, the bytes of
//     this rank's piece entering the collective (all_gather: the gathered
//     piece; reduce_scatter, all_reduce, all_to_all: the input piece);
//   * ops: every op call (autograd's call()) and every backward node the
//     engine runs, with the bytes of their outputs (local pieces): what the
//     planner charges for dispatch and for memory-bound passes;
//   * Meta memory: every Meta storage created under the scope, rounded to
//     the CPU allocator's size classes, from creation to destruction (even
//     when another thread frees it): a Meta step's peak is the real step's
//     allocator peak for the tensors it creates.
// With no scope open, counting costs one thread-local load per op.
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

namespace tessel::cost {

struct Counts {
  int64_t gemm_flops = 0;
  int64_t attention_flops = 0;
  int64_t ops = 0;       // op calls (forward) and backward nodes that ran (gradient accumulation excluded)
  int64_t op_bytes = 0;  // bytes of their outputs (this rank's pieces): memory traffic besides the GEMMs
  std::map<std::string, int64_t> comm_bytes;  // by collective: all_gather, reduce_scatter, all_reduce, all_to_all
  std::map<std::string, int64_t> comm_calls;
  // Ops without a sharding rule that ran on distributed inputs, which were
  // replicated first (dtensor/dist_call.h): calls, by op.
  std::map<std::string, int64_t> replicated_fallbacks;
  int64_t flops() const { return gemm_flops + attention_flops; }
  int64_t total_comm_bytes() const;
};

// a - b, field by field (the counts of a span inside a scope).
Counts difference(const Counts& a, const Counts& b);

// Live and peak bytes of the Meta storages created under one scope.
struct MetaMemory {
  std::atomic<int64_t> live{0}, peak{0};
  void add(int64_t bytes);
  void sub(int64_t bytes) { live.fetch_sub(bytes, std::memory_order_relaxed); }
};

class CountScope {
 public:
  CountScope();
  ~CountScope();
  CountScope(const CountScope&) = delete;
  CountScope& operator=(const CountScope&) = delete;
  const Counts& counts() const { return counts_; }
  int64_t meta_live_bytes() const { return meta_->live.load(); }
  int64_t meta_peak_bytes() const { return meta_->peak.load(); }
  // Starts a new peak from the bytes alive now.
  void reset_meta_peak() { meta_->peak.store(meta_->live.load()); }

 private:
  Counts counts_;
  std::shared_ptr<MetaMemory> meta_;
  CountScope* prev_;
  std::shared_ptr<MetaMemory> prev_meta_;
};

// Stops counting (FLOPs, bytes and Meta memory) on this thread for its
// lifetime: work that is not the step's own, like the global-shape Meta run
// by which a distributed op checks its shapes (dtensor/dist_call.h).
class Pause {
 public:
  Pause();
  ~Pause();
  Pause(const Pause&) = delete;
  Pause& operator=(const Pause&) = delete;

 private:
  CountScope* scope_;
  std::shared_ptr<MetaMemory> meta_;
};

// The counts of this thread's innermost scope; null when none is open.
Counts* active();
// The Meta memory tracker of this thread's innermost scope (null: none).
const std::shared_ptr<MetaMemory>& active_meta_memory();

// Op-level reports (no-ops without a scope).
void add_gemm(int64_t batch, int64_t m, int64_t n, int64_t k);
void add_attention(int64_t flops);
void add_comm(const char* collective, int64_t bytes);
void add_op(int64_t output_bytes);
void add_replicated_fallback(const char* op);

}  // namespace tessel::cost
