#pragma once
// The auto-planner: the fastest layout of a model that fits a cluster
// (docs/plan.md).
//
//   PlanRequest r{models::model_config("llama", "small"), cluster_preset("cpu"), /*global_batch=*/8, /*seq_len=*/256};
//   (or r.model = PlanModel::custom("MyNet", n_layer, build) for a model of one's own, simulate.h)
//   PlanResult p = plan(r);      // p.best, p.runners_up (each with why it lost)
//
// Every layout of the cluster's devices is a candidate: dp x tp x pp x cp x
// ep (ep for models with experts), ZeRO 0-3, micro-batches, sequence
// parallelism, activation recomputation. A candidate's per-rank work on a
// micro-batch -- FLOPs, tensor/context/expert-parallel bytes, memory peak --
// is measured by a step on the Meta device (planner/simulate.h; exact against
// real runs, test_planner); data parallelism (gradient all-reduce or ZeRO's
// reduce-scatter and gathers), pipeline stages (the layer cut into pp x V
// virtual stages, the schedule -- GPipe, 1F1B, interleaved -- run with the
// stages' costs for its makespan, bubble and in-flight micro-batches, the
// activation transfers), the optimizer
// (AdamW state and its pass over memory) and the cluster's speeds are
// composed on top. What is modelled, and what is not, is in docs/plan.md.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/config.h"
#include "nn/parallel/plan.h"
#include "nn/recompute.h"
#include "planner/cluster.h"
#include "planner/simulate.h"

namespace tessel::planner {

struct PlanRequest {
  PlanModel model;  // a shipped model's config, or PlanModel::custom(...) for one's own
  Cluster cluster;
  int64_t global_batch = 8;  // sequences per optimizer step
  int64_t seq_len = 256;
  DType compute = DType::Float32;  // parameters and optimizer state stay float32
  bool bitwise = false;
  double headroom = 0.10;          // share of each device's memory kept free
  // Constraints: a mesh dim's size ("dp", "tp", "pp", "cp", "ep"), "zero",
  // "micro_batches", "sp" (0/1), "virtual_stages" (1: no interleaving);
  // unset: searched.
  std::map<std::string, int64_t> fixed;
  std::optional<nn::Recompute> recompute;  // unset: searched
  int runners_up = 5;
};

struct Candidate {
  int64_t dp = 1, tp = 1, pp = 1, cp = 1, ep = 1;
  int zero = 0;
  int64_t micro_batches = 1;
  bool sp = false;
  nn::Recompute recompute = nn::Recompute::None;
  std::string schedule = "1f1b";  // with pp > 1: gpipe (micro_batches < pp) | 1f1b | interleaved
  int virtual_stages = 1;         // interleaved: chunks of blocks per pp rank (2-4)
  // Predicted seconds per step, by part.
  double compute_s = 0, model_comm_s = 0, pipeline_s = 0, dp_comm_s = 0, optimizer_s = 0, step_s = 0;
  double bubble = 0;  // share of the pipeline's time idle
  double mfu = 0;     // model FLOPs per second / the cluster's (assumed or measured) rate
  // Predicted bytes per rank (the largest stage), by part; they add up to
  // total. grads: the gradients (ZeRO-2/3: this rank's shards) alive at the
  // peak; activations: the rest of the step's peak -- saved activations,
  // transients, and under ZeRO-2/3 full gradients not yet reduced.
  int64_t params = 0, grads = 0, optimizer = 0, activations = 0, comm_buffers = 0, total = 0;
  bool fits = false;
  // Ops without a sharding rule that run on distributed inputs in this
  // layout (they replicate them first, which the prediction counts): calls
  // per micro-batch, by op. Never silent: the report lists them.
  std::map<std::string, int64_t> replicated_fallbacks;
  std::string infeasible;  // why it cannot run at all (empty: it can)
  std::string why_not;     // for runners-up: why the best beat it

  std::string mesh() const;    // "dp=2,tp=2" (size-1 dims left out; "" for one device)
  std::vector<Mesh::DimSpec> mesh_dims() const;  // the same, for Mesh::world
  std::string mesh_dims_cpp() const;             // {"dp", 2}, {"tp", 2}: as C++
  std::string str() const;     // mesh, zero, micro-batches, sp, recompute
  nlohmann::json to_json() const;
};

struct PlanResult {
  Candidate best;
  parallel::ParallelPlan best_plan;  // its parameter and module placements (the model's plan, for best.sp)
  // A model of one's own (plan derived): the patterns found and the layers
  // left replicated, with why. Empty for the shipped models' built-in plans.
  parallel::DeriveReport derived;
  // Ops without a sharding rule (planner/simulate.h), calls per sequence's
  // step: they run replicated in every layout. Under tp, cp and ep the
  // prediction counts the gathers (Candidate::replicated_fallbacks); under dp
  // the batch is gathered too and each rank runs the op on the whole batch,
  // which it does not -- the report says so.
  std::map<std::string, int64_t> ops_without_sharding_rule;
  // What the prediction is known to miss for the best layout (the report's
  // "warning:" lines).
  std::vector<std::string> warnings;
  std::vector<Candidate> runners_up;
  int64_t candidates = 0;   // layouts considered
  int64_t infeasible = 0;   // ... that cannot run (shapes that do not divide, ...)
  int64_t too_big = 0;      // ... that run but do not fit
  int64_t simulations = 0;  // Meta steps run
  double seconds = 0;       // planning time
};

// Throws when nothing fits, naming the smallest per-device memory that would
// and the layout that needs it; and on contradictory constraints.
PlanResult plan(const PlanRequest& request);

// The readable report and the JSON document of a plan.
std::string format_plan(const PlanRequest& request, const PlanResult& result);
nlohmann::json plan_json(const PlanRequest& request, const PlanResult& result);

}  // namespace tessel::planner
