#pragma once
// Pipeline parallelism for a language model (docs/parallel.md, "Pipeline
// parallelism"): the pieces of this folder put together for a training loop.
//
//   Pipeline pipe(model_config, mesh /* with a "pp" dim */, plan, seed, micro_batches, opts);
//   nn::AdamW opt(pipe.param_groups(weight_decay), ...);   // this rank's parameters only
//   for (step ...) {
//     auto r = pipe.train_step(seed, step, global_batch, micro_batches_of_the_step);
//     double norm = pipe.clip_grad_norm_(1.0);              // all stages' gradients
//     opt.step(); opt.zero_grad();
//   }
//
// Every rank of the mesh calls every method in the same order (they are
// collective). Errors before any work: the schedule's rules (micro-batches vs
// pp, virtual stages) are checked and the schedule is verified (check_schedule)
// before the model is built; the partition checks the blocks fill pp x V stages.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nn/optim.h"
#include "nn/parallel/pipeline/executor.h"
#include "nn/parallel/pipeline/schedule.h"
#include "nn/parallel/pipeline/stage.h"

namespace tessel::parallel::pipeline {

struct PipelineOptions {
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved
  int virtual_stages = 1;         // chunks per rank (interleaved: >= 2)
  std::string split = "layers";   // layers | params
  DType compute = DType::Float32; // autocast dtype of the training forwards
};

// One micro-batch of token ids as the data loader gives it (plain [b, T]).
struct MicroBatchIds {
  Tensor inputs, targets;
  int64_t first_sample = 0;  // global index of row 0
};

struct PipelineStepResult {
  double loss = 0;                 // mean over the micro-batches of the whole model's loss (every rank)
  double loss_sum = 0;             // their sum (bitwise mode: the one-device loop's bits)
  std::optional<double> aux_loss;  // the last micro-batch's aux loss summed over all blocks (MoE models)
  double comm_wait_s = 0;          // this rank's time blocked in point-to-point transfers
  double comm_wait_mean_s = 0;     // the same, averaged over the ranks of this rank's pp group
};

class Pipeline {
 public:
  Pipeline(const models::ModelConfig& config, const MeshPtr& mesh, const ParallelPlan& plan, uint64_t seed,
           int64_t micro_batches, const PipelineOptions& opts);

  const PipelineStage& stage() const { return *stage_; }
  const Schedule& schedule() const { return schedule_; }
  const ScheduleStats& schedule_stats() const { return stats_; }
  models::LanguageModel& model() const { return stage_->model(); }

  // AdamW's default groups (decay / no decay) restricted to this rank's parameters.
  std::vector<nn::ParamGroup> param_groups(double weight_decay) const;
  // Bytes of this rank's parameter pieces.
  int64_t local_parameter_bytes() const;

  // Forwards and backwards of one step's micro-batches; gradients are left
  // accumulated in this rank's parameters (scaled by 1 / M).
  PipelineStepResult train_step(uint64_t seed, uint64_t step, int64_t global_batch,
                                const std::vector<MicroBatchIds>& micro_batches);
  // Sums tied gradients over their holders, then the global L2 norm of all
  // stages' gradients (each parameter counted once), combined in the order of
  // nn::clip_grad_norm_ over the whole model (the same bits for the same
  // gradients); with max_norm > 0 clips every gradient by the same factor.
  // Returns the norm.
  double clip_grad_norm_(double max_norm);

  // Token ids [B, T] -> logits on every rank (evaluation, sampling; no grad).
  Tensor forward(const Tensor& ids);
  // The plan's layout of ids / targets on the stage mesh.
  Tensor layout(const Tensor& ids) const { return stage_->layout(ids); }

  // Every parameter of the model, full and plain, in model order, on world
  // rank 0 (empty elsewhere). Each stage gathers its pieces (full_tensor) and
  // sends them to pp rank 0: the whole model crosses the pp links once per
  // call and rank 0 holds all of it meanwhile. For hashes and tests, not for
  // speed.
  std::vector<std::pair<std::string, Tensor>> gather_parameters() const;

 private:
  Schedule schedule_;
  ScheduleStats stats_;
  PipelineOptions opts_;
  std::unique_ptr<PipelineStage> stage_;
  std::unique_ptr<Executor> executor_;
};

// Whether `mesh` has a pipeline dim ("pp").
bool has_pipeline_dim(const Mesh& mesh);

}  // namespace tessel::parallel::pipeline
