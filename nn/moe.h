#pragma once
// Mixtral's sparse mixture of experts with a top-k router.
#include <cstdint>
#include <memory>
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
};

// forward(x [..., C]) -> [..., C]. With the N tokens of x as rows:
//   probs   = softmax(gate(x)) over all E experts         [N, E]  (float32 at least, never autocast)
//   top-k   = topk(probs, k) (ties: lower expert index first)
//   weights = top-k probs / their sum (renormalised over the k)
//   out[n]  = sum over n's k experts e of weights[n, e] * experts[e](x[n])
// Dispatch is index_select of each expert's tokens (in token order) through
// its SwiGLU; the combine is one index_add of all k·N weighted rows (listed
// expert-major) into zeros: a canonical, thread-count-independent sum per
// token (kernels/cpu/segment_sum.h). Experts that get no token are not run
// (their parameters get no gradient in that step). Under autocast the experts
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
  const std::vector<int64_t>& last_expert_counts() const { return counts_; }

  const MoEConfig config;
  std::shared_ptr<Linear> gate;         // Linear(C, E, no bias): the router
  std::shared_ptr<ModuleList> experts;  // E SwiGLU(C, hidden)

 private:
  std::vector<std::shared_ptr<SwiGLU>> expert_list_;
  Tensor aux_loss_;
  std::vector<int64_t> counts_;
};

}  // namespace tessel::nn
