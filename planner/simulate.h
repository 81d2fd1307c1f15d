#pragma once
// What one micro-batch's forward and backward cost each rank of a layout,
// measured by running it on the Meta device (no memory, no kernels, no
// communication) with the counters of runtime/cost.h: the FLOPs of every
// GEMM and attention, the bytes of every redistribution (tensor, sequence,
// context and expert parallel), and the memory the real step would hold at
// its peak (parameters, gradients, saved activations and transients, each
// storage rounded as the CPU allocator rounds it).
//
// Only the dims that cut a micro-batch's work are simulated (tp, cp, ep: one
// thread per rank); data and pipeline parallelism, ZeRO and the optimizer
// are composed on top by the planner (planner/planner.h), which also scales
// a 2-block and a 3-block run to any depth: a model's cost is its embedding
// and head plus n_layer blocks, so per-block costs come out exact and
// planning a 126-layer model costs what a 2-layer one does.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dtensor/mesh.h"
#include "models/config.h"
#include "nn/parallel/derive.h"
#include "nn/parallel/plan.h"
#include "nn/recompute.h"
#include "nn/staged.h"
#include "runtime/cost.h"

namespace tessel::planner {

// A model to plan: itself at any depth, and its parallel plan. Token models
// (an nn::StagedModel taking ids [B, T], loss(forward(ids), targets [B, T])):
// the shipped ones by their config, or one of one's own:
//
//   PlanModel m = PlanModel::custom("ParallelGPT", /*n_layer=*/4,
//                                   [](int64_t n) { return nn::make_model<ParallelGPT>(n); });
struct PlanModel {
  std::string name;         // in reports
  int64_t n_layer = 0;      // blocks
  int64_t dim = 0;          // width of the activations between blocks (pipeline transfers)
  int64_t max_seq_len = 0;  // the longest sequence it takes (0: not known, not checked)
  int64_t num_experts = 0;  // experts per MoE layer (0: none, and ep is not searched)
  // Attention heads and key/value heads (0: not known). Where known, tp must
  // divide both: whole heads per rank, as `tessel train` requires.
  int64_t n_head = 0, n_kv_head = 0;
  // The model with n blocks, built on the current nn::ConstructionScope
  // device (Meta when planning: no memory).
  std::function<std::shared_ptr<nn::StagedModel>(int64_t n_layer)> build;
  // Its plan for tensor, sequence and expert parallelism; unset: derived
  // from the model (parallel::derive_plan).
  std::function<parallel::ParallelPlan(nn::StagedModel& model, bool sequence_parallel)> plan;
  std::string train_args;   // how `tessel train` runs it ("--model llama --config small"; empty: not shipped)

  PlanModel() = default;
  PlanModel(const models::ModelConfig& config);  // NOLINT: a shipped model's config is a PlanModel
  // A model of one's own: `build(n)` makes it with n blocks. Its width and
  // experts are read from build(1) on Meta.
  static PlanModel custom(std::string name, int64_t n_layer,
                          std::function<std::shared_ptr<nn::StagedModel>(int64_t n_layer)> build);
  // The plan for a laid-out `model` (plan, or derive_plan, which fills
  // `report` with what it found and left replicated).
  parallel::ParallelPlan plan_for(nn::StagedModel& model, bool sequence_parallel,
                                  parallel::DeriveReport* report = nullptr) const;
  std::string describe() const { return name; }
};

// The part of a layout a micro-batch sees on one rank.
struct ShardLayout {
  int64_t tp = 1, cp = 1, ep = 1;
  bool sequence_parallel = false;
  nn::Recompute recompute = nn::Recompute::None;
  bool bitwise = false;
  int64_t batch = 1;    // sequences in this rank's micro-batch
  int64_t seq_len = 0;  // tokens per sequence (cut over cp)
  DType compute = DType::Float32;  // the forward's autocast dtype (parameters stay float32)
  // With no dim to cut: lay the one rank out on a 1-device mesh anyway, so
  // every activation is distributed (ops_without_sharding_rule).
  bool on_mesh = false;
  std::string str() const;
};

// The mesh a shard layout's ranks form: {cp, ep, tp}, size-1 dims left out
// (empty: one rank, no mesh; {dp: 1} for on_mesh).
std::vector<Mesh::DimSpec> mesh_dims(const ShardLayout& l);

struct RankCost {
  int64_t flops = 0;          // GEMM + attention, forward and backward (and the replays of recomputation)
  int64_t gemm_flops = 0, attention_flops = 0;
  int64_t ops = 0, op_bytes = 0;  // op calls and backward nodes, and their outputs' bytes
  int64_t param_bytes = 0;    // this rank's pieces of the parameters
  int64_t peak_bytes = 0;     // the most alive at once: parameters, gradients, activations, transients
  int64_t live_after_forward = 0;   // alive when the forward and the loss are done
  int64_t peak_backward_start = 0;  // the most alive from then until the last block's backward is done
  // The step's peak. For a simulated step it is peak_bytes; for one scaled
  // to another depth (ModelCost::at) the two peaks grow differently -- the
  // window's with every block's saved activations, the rest with their
  // gradients -- and the larger is the step's.
  int64_t step_peak() const { return std::max(peak_bytes, peak_backward_start); }
  std::map<std::string, int64_t> comm_bytes;  // per collective kind
  std::map<std::string, int64_t> comm_calls;
  std::map<std::string, int64_t> replicated_fallbacks;  // ops without a sharding rule (runtime/cost.h): calls
  int64_t total_comm_bytes() const;
};

// Each rank's cost of one micro-batch of `model` (at its n_layer) under `l`,
// for its plan. Throws what the layout's own checks
// throw when it cannot run (a tp that does not divide the heads, ...).
std::vector<RankCost> simulate(const PlanModel& model, const ShardLayout& l);

// The same as embedding + head (`base`) and one block (`block`), from a
// 2-block and a 3-block run (the largest rank of each): cost(n blocks) =
// base + n x block, for every field.
struct ModelCost {
  RankCost base, block;
  RankCost at(int64_t blocks) const;
};
ModelCost simulate_per_block(const PlanModel& model, const ShardLayout& l);

// The ops of `model` that have no sharding rule (dtensor/dist_call.h) and
// the calls of each in one training step of one sequence at its depth: they
// run on any layout, on replicated inputs (what a rule-less op does with
// distributed ones). Found by a step on Meta over a 1-device mesh, where
// every activation is distributed, so every layout's fallbacks show.
std::map<std::string, int64_t> ops_without_sharding_rule(const PlanModel& model, int64_t seq_len);

}  // namespace tessel::planner
