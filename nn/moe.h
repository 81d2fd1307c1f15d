#pragma once
// Mixtral's sparse mixture of experts with a top-k router.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/container.h"
#include "nn/linear.h"
#include "nn/mlp.h"

namespace tessel::nn {

struct MoEConfig {
  int64_t dim = 0;          // model width C
  int64_t hidden = 0;       // each expert's SwiGLU hidden width
  int64_t num_experts = 0;  // E
  int64_t top_k = 2;        // experts per token (1 <= k <= E)
  double capacity_factor = 0;  // > 0: each expert takes at most expert_capacity(...) token-slots; 0: no limit
};

// Token-slots one expert takes in a forward of `tokens` tokens (all ranks'
// tokens under data/expert parallelism): ceil(capacity_factor * tokens *
// top_k / num_experts); with capacity_factor <= 0 there is no limit
// (INT64_MAX). The slots routed to an expert beyond its capacity are dropped:
// for each expert the first `capacity` slots in token order are kept (the
// global batch order, so a sharded run drops exactly the single-device
// run's slots), the rest contribute zero to their tokens' outputs (the
// residual connection carries those tokens on). Weights are not
// renormalised after a drop.
int64_t expert_capacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t num_experts);

class MoE;

// Statistics of one forward, over all tokens (all ranks): routed and dropped
// token-slots per expert.
struct MoEStats {
  std::vector<int64_t> counts;   // routed slots per expert (before capacity), sums to N * k
  std::vector<int64_t> dropped;  // slots dropped by the capacity, per expert
};

// How routed token-slots reach the experts and come back. The MoE routes
// (router, top-k, weights) and computes the load-balancing loss itself; the
// dispatch runs the experts. The default (no dispatch installed) runs every
// expert in this process on index_select'ed tokens; expert parallelism
// (nn/parallel/expert_parallel.h) installs one that moves tokens between the
// ranks that own the experts. Model code does not change either way.
class ExpertDispatch {
 public:
  virtual ~ExpertDispatch() = default;
  // The layout the tokens x2d [N, C] should have before routing (the
  // router's tensors inherit it). Default: as they come.
  virtual Tensor layout(MoE& /*moe*/, const Tensor& x2d) { return x2d; }
  // out [N, C]: for each token, the sum over its kept slots of
  // weights[n, j] * expert_{top_i[n, j]}(x2d[n]), in the order of the
  // default (expert-major index_add). x2d, top_i [N, K] (int64) and weights
  // [N, K] come in the layout above; fills `stats` (global counts).
  virtual Tensor dispatch(MoE& moe, const Tensor& x2d, const Tensor& top_i, const Tensor& weights,
                          MoEStats& stats) = 0;
  virtual std::string describe() const = 0;
};

// forward(x [..., C]) -> [..., C]. With the N tokens of x as rows:
//   probs   = softmax(gate(x)) over all E experts         [N, E]  (float32 at least, never autocast)
//   top-k   = topk(probs, k) (ties: lower expert index first)
//   weights = top-k probs / their sum (renormalised over the k)
//   out[n]  = sum over n's k experts e of weights[n, e] * experts[e](x[n])
// Dispatch is index_select of each expert's tokens (in token order) through
// its SwiGLU; the combine is one index_add of all k·N weighted rows (listed
// expert-major) into zeros: a canonical, thread-count-independent sum per
// token (kernels/cpu/segment_sum.h). With a capacity factor, slots beyond an
// expert's capacity are dropped first (expert_capacity). Experts that get no
// token are not run (their parameters get no gradient in that step). An
// installed ExpertDispatch replaces the dispatch and combine (same result). Under autocast the experts
// run in the compute dtype; the router (x cast up, gate, softmax, top-k) runs
// in float32 outside autocast so routing decisions do not depend on the
// compute dtype, and the combine is float32.
//
// Load-balancing loss (Switch Transformer / Mixtral), computed every forward:
//   aux = E * sum_e f_e * P_e
//   f_e = (token-slots routed to e) / (N * k)   (a constant: no gradient)
//   P_e = mean over tokens of probs[:, e]         (differentiable, via the router)
// It is 1 for perfectly uniform routing. (HF's load_balancing_loss_func
// counts f_e per token rather than per slot, which gives k times this value.)
// It is a per-call statistic: with micro-batches, average the micro-batch
// values (not the same as the full-batch value, since it is a product of means).
// Under data/expert parallelism f and P are over all ranks' tokens (the same
// value as on one device). Drops (capacity_factor) do not change f: it counts
// routed slots.
class MoE : public UnaryModule {
 public:
  explicit MoE(const MoEConfig& config);
  Tensor forward(const Tensor& x) override;
  std::string extra_repr() const override;

  // The last forward's aux loss: a 0-D differentiable tensor (float32; float64
  // for float64 models); undefined before the first forward. Add it (times a
  // coefficient, Mixtral: 0.02) to the loss.
  const Tensor& last_aux_loss() const { return aux_loss_; }
  // The last forward's token-slots per expert (sums to N * k), for metrics.
  const std::vector<int64_t>& last_expert_counts() const { return stats_.counts; }
  // The last forward's slots dropped by the capacity, per expert and in all.
  const std::vector<int64_t>& last_dropped() const { return stats_.dropped; }
  int64_t last_dropped_tokens() const;
  // Forgets the last forward (aux loss, counts), as before the first one: a
  // forward that was not the model's (parallel::derive_plan's Meta trace).
  void forget_last_forward();

  // The capacity factor (starts as config.capacity_factor; see expert_capacity).
  double capacity_factor() const { return capacity_factor_; }
  void set_capacity_factor(double f);

  // Replaces how tokens reach the experts (null: the default, all experts here).
  void set_dispatch(std::shared_ptr<ExpertDispatch> d) { dispatch_ = std::move(d); }
  const std::shared_ptr<ExpertDispatch>& dispatch() const { return dispatch_; }
  SwiGLU& expert(int64_t e) { return *expert_list_.at(size_t(e)); }
  // The dispatch without an ExpertDispatch: every expert run here on
  // index_select'ed tokens, through the ops' own sharding rules on a mesh
  // (for dispatches that find nothing to do better on some layout).
  Tensor dispatch_default(const Tensor& x2d, const Tensor& top_i, const Tensor& weights, MoEStats& stats);

  const MoEConfig config;
  std::shared_ptr<Linear> gate;         // Linear(C, E, no bias): the router
  std::shared_ptr<ModuleList> experts;  // E SwiGLU(C, hidden)

 private:
  std::vector<std::shared_ptr<SwiGLU>> expert_list_;
  std::shared_ptr<ExpertDispatch> dispatch_;
  double capacity_factor_ = 0;
  Tensor aux_loss_;
  MoEStats stats_;
};

// An expert's computation on given weights, w2(silu(w1 x) * w3 x) with the
// casts of SwiGLU::forward (same bits), for dispatches that hold the weights
// as local pieces. Forward hooks of the expert modules do not run.
Tensor expert_swiglu(const Tensor& x, const Tensor& w1, const Tensor& w2, const Tensor& w3);

// The expert of each token-slot of top_i [N, k], in token order. On the Meta
// device (planning a layout: no values) a balanced routing stands in for the
// router's choice: slot s goes to expert s mod E, so every expert gets N k / E
// slots, as a well-balanced router would give it.
std::vector<int64_t> routing_choice(const Tensor& top_i, int64_t num_experts);

// Every MoE layer under `root` (in module order).
std::vector<MoE*> moe_layers(const Module& root);
// Sets the capacity factor of every MoE layer under `root`; a factor > 0 for
// a model without MoE layers is an error (it would do nothing).
void set_capacity_factor(const Module& root, double capacity_factor);
// Slots dropped by the capacity in the last forward, summed over the layers.
int64_t dropped_tokens(const Module& root);

}  // namespace tessel::nn
