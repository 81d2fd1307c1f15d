#pragma once
// Expert parallelism for nn::MoE (docs/parallel.md, "Expert parallelism").
//
// On a mesh with an expert dim (say "ep", P coordinates) and E experts (P
// divides E), expert e lives on ep coordinate e / (E / P): its weights are
// ShardOn(0, that coordinate) over ep (dtensor/placement.h), so the other
// coordinates hold empty pieces, and the usual placements elsewhere
// (Replicate over dp, Megatron shards over tp). The tokens are sharded over
// ep (and dp): each rank routes its own tokens with the replicated router,
// then per layer
//
//   1. counts: every rank's routed slots per expert are all-gathered over
//      the token dims (a few integers): global counts (the aux loss and the
//      metrics), and the capacity rule applied in global token order (the
//      single-device drops, whatever the sharding);
//   2. dispatch: the kept slots' token rows, ordered by expert (so by owner),
//      go to their owners with all_to_all_v over ep (autograd/ops/all_to_all.h);
//   3. the owner runs each local expert once on all its rows (from every
//      source rank) with the local pieces of the expert weights;
//   4. combine: the outputs travel back with the reverse all_to_all_v and
//      are summed per token, weighted by the router probabilities, with the
//      same expert-major index_add as on one device (so the forward has the
//      single-device bits).
// Both exchanges are differentiable: the backward of each is the other
// direction. Expert weight gradients are Partial over the token dims other
// than ep (the dp all-reduce of the parameter), ShardOn over ep; experts that
// no rank ran get no gradient anywhere (as on one device), and a rank that
// did not run an expert that others ran gives a zero (or empty) gradient, so
// every rank takes part in the same collectives.
//
// With tensor parallelism the expert weights keep their tp shards; tokens are
// replicated over tp and the expert outputs are Partial over tp (the
// row-parallel sum, reduced where the output is next needed). Bitwise mode
// gathers each expert's pieces over tp instead and runs it whole (the
// one-device sums): outputs Replicate over tp, weight gradients sliced back.
#include <memory>
#include <string>

#include "dtensor/mesh.h"
#include "nn/moe.h"

namespace tessel::parallel {

// Where expert e of `num_experts` lives on an expert dim of size ep: the
// coordinate e / (num_experts / ep). Throws unless ep divides num_experts.
int64_t expert_owner(int64_t e, int64_t num_experts, int64_t ep, const std::string& where = "expert parallel");

// The dispatch parallelize() installs on MoE layers matched by a plan's
// `experts` rule (their parameters must already be laid out).
class ExpertParallelDispatch final : public nn::ExpertDispatch {
 public:
  ExpertParallelDispatch(MeshPtr mesh, int ep_dim);
  Tensor layout(nn::MoE& moe, const Tensor& x2d) override;
  Tensor dispatch(nn::MoE& moe, const Tensor& x2d, const Tensor& top_i, const Tensor& weights,
                  nn::MoEStats& stats) override;
  std::string describe() const override;

 private:
  MeshPtr mesh_;
  int ep_dim_;
};

}  // namespace tessel::parallel
