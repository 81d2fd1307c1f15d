#pragma once
// One rank's part of a pipelined model.
//
// The model is any nn::StagedModel (nn/staged.h: embed -> blocks() -> head,
// plus its loss), a plain module tree that every rank builds the same way:
// on Meta (nn::ConstructionScope meta(kMeta): no memory, all ranks agree on
// names and shapes) or materialised on the CPU with values (a user who
// initialised or loaded weights). Its blocks are cut into S = pp x V virtual
// stages (partition.h); rank r holds the chunks vs = c * pp + r
// (schedule.h), plus the embedding when it holds vs 0 and the head when it
// holds vs S-1. The stage takes the model over and edits it in place: what
// this rank holds keeps its values when it has some, and Meta parameters of
// it are materialised and initialised from (seed, path), so they are the
// single-device model's values; what it does not hold becomes Meta tensors,
// its memory dropped. So each rank (thread or process) passes its own
// instance, never one shared with another rank.
//
// Which parameters the embedding and the head use is found by tracing them
// on Meta tensors (embed(example_input()), then head() of its output;
// autograd::grad on Meta computes no values): no model has to declare it,
// and a tied matrix (NanoGPT's wte: embedding and LM head) is found in both.
// Such a parameter is held by the first and the last rank; its gradient is
// summed over the two (sync_tied_grads) and it counts once in norms and
// hashes (on its *primary* rank, the lowest one holding it). Blocks own the
// parameters and buffers under their module.
//
// Within a stage the other mesh dims (dp, tp, ...) work as without a
// pipeline: the whole model is parallelized with the plan on the sub-mesh
// without "pp" (Mesh::sub), so every stage keeps the plan's layouts.
#include <memory>
#include <string>
#include <vector>

#include "dtensor/mesh.h"
#include "nn/parallel/pipeline/partition.h"
#include "nn/parallel/plan.h"
#include "nn/staged.h"
#include "runtime/comm/comm.h"

namespace tessel::parallel::pipeline {

struct StageOptions {
  int virtual_stages = 1;         // V: chunks per rank
  std::string split = "layers";  // layers | params (partition.h)
};

// Where a parameter of the whole model lives.
struct ParamHome {
  std::string name;
  int primary = 0;      // lowest pp rank holding it
  bool held = false;    // this rank holds (and has materialised) it
  bool tied = false;    // held by more than one pp rank
};

// Whether `mesh` has a pipeline dim ("pp").
bool has_pipeline_dim(const Mesh& mesh);

class PipelineStage {
 public:
  // Collective over `mesh` (it splits the tied-parameter group off the pp
  // communicator). `model`: the plain (not parallelized) model, on Meta or
  // materialised (see above); `mesh` must have a "pp" dim; `plan` lays the
  // stage out on the other dims (ignored when pp is the only dim); `seed`
  // initialises the Meta parameters this rank holds. Throws naming the
  // model's type, the mesh and the sizes when the blocks cannot fill pp x V
  // stages, a parameter belongs to no stage or to two blocks, or the model
  // is already distributed.
  PipelineStage(std::shared_ptr<nn::StagedModel> model, const MeshPtr& mesh, const ParallelPlan& plan, uint64_t seed,
                const StageOptions& opts);

  nn::StagedModel& model() const { return *model_; }
  const std::shared_ptr<nn::StagedModel>& model_ptr() const { return model_; }
  const MeshPtr& mesh() const { return mesh_; }
  // The mesh of this stage (the dims other than pp); null when pp is the only dim.
  const MeshPtr& stage_mesh() const { return stage_mesh_; }
  const ParallelPlan& plan() const { return plan_; }
  // The pp communicator (its rank = pp coordinate); null when pp = 1.
  const comm::CommPtr& pp_comm() const { return pp_comm_; }
  int pp_rank() const { return pp_rank_; }
  int pp_size() const { return pp_size_; }
  int virtual_stages() const { return opts_.virtual_stages; }
  int num_stages() const { return pp_size_ * opts_.virtual_stages; }
  int stage_of(int chunk) const { return chunk * pp_size_ + pp_rank_; }
  const Partition& partition() const { return partition_; }
  // True when this rank's sub-mesh coordinates are all 0 (the pp group of world rank 0).
  bool in_main_group() const { return main_group_; }

  // This rank's parameters (materialised), in model order.
  const std::vector<nn::NamedTensor>& named_parameters() const { return held_; }
  std::vector<Tensor> parameters() const;
  // This rank's parameters whose gradients count here (tied ones only on
  // their primary rank), with their index in homes().
  std::vector<std::pair<size_t, Tensor>> primary_parameters() const;
  // Every parameter of the model, in model order.
  const std::vector<ParamHome>& homes() const { return homes_; }
  // Sums the gradients of tied parameters over the ranks that hold them.
  void sync_tied_grads() const;
  // Bitwise mode: each tied parameter's per-micro-batch gradients, kept by
  // its gradient hook until sync_tied_grads (indexed like parameters();
  // empty lists elsewhere). Compile mode records them as the step's outputs
  // and puts the replayed ones back (the hooks do not run in a replay).
  std::vector<std::vector<Tensor>> tied_contributions() const;
  void set_tied_contributions(const std::vector<std::vector<Tensor>>& contributions) const;
  void sync_tied_bitwise(const nn::NamedTensor& p, std::vector<Tensor>& contrib) const;
  // The plan's data layout of a batch (inputs or targets, dim 0 = batch) on
  // the stage mesh (identity for pp only).
  Tensor layout(const Tensor& batch) const;
  // "pp rank 1 of 2: stages 1 [2, 4) + head; 3 parameters tensors, ..."
  std::string describe() const;

 private:
  std::shared_ptr<nn::StagedModel> model_;
  MeshPtr mesh_, stage_mesh_;
  ParallelPlan plan_;
  comm::CommPtr pp_comm_, tied_comm_;
  int pp_rank_ = 0, pp_size_ = 1;
  bool main_group_ = true;
  StageOptions opts_;
  Partition partition_;
  std::vector<nn::NamedTensor> held_;
  std::vector<ParamHome> homes_;
  // Bitwise mode: each tied parameter's gradient per micro-batch, in
  // backward order (index: position in held_).
  std::vector<std::shared_ptr<std::vector<Tensor>>> tied_contrib_;
};

}  // namespace tessel::parallel::pipeline
