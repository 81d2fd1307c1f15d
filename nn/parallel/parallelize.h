#pragma once
// parallelize(model, mesh, plan): lays a model out on a mesh by a plan
// (nn/parallel/plan.h). Parameters become distributed tensors with the
// plan's placements (each rank keeps its piece; values are those of the
// single-device model); modules named by the plan's module rules get forward
// hooks that redistribute their inputs and outputs. The model's own code is
// untouched: its ops run through their sharding rules (docs/distributed.md).
//
// MoE layers matched by the plan's `experts` rules, on a mesh with the
// rule's dim, become expert parallel (nn/parallel/expert_parallel.h): their
// expert weights are ShardOn(0, owner) over that dim and their dispatch moves
// tokens between the owners.
//
// Errors before any work: a plan rule that matches no parameter or module,
// a placement naming a dim a parameter does not have, an experts rule on a
// module that is not an MoE layer, an expert dim that does not divide the
// number of experts.
#include <string>
#include <utility>
#include <vector>

#include "nn/module.h"
#include "nn/parallel/plan.h"

namespace tessel::parallel {

struct ParallelizeResult {
  std::vector<std::pair<std::string, Placements>> params;  // every parameter's placements, by path
  int module_hooks = 0;
  int expert_layers = 0;  // MoE layers made expert parallel
};

// `model` may be materialised (its parameters are sliced, values kept) or on
// Meta (parameters become Meta distributed tensors: materialize() and
// reset_parameters(seed) then create and initialise only the local pieces).
ParallelizeResult parallelize(nn::Module& model, const MeshPtr& mesh, const ParallelPlan& plan);

// The plan's layout for the token ids [B, T] on `mesh` (plain ids are full on
// every rank; the result keeps each rank's piece). A tensor with no time dim
// (labels [B]) is replicated over a "cp" dim rather than cut.
Tensor distribute_batch(const Tensor& ids, const MeshPtr& mesh, const ParallelPlan& plan);

// Bytes this rank holds for the parameters (their local pieces).
int64_t local_parameter_bytes(const nn::Module& model);

}  // namespace tessel::parallel
