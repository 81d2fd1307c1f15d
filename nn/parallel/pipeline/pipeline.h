#pragma once
// Pipeline parallelism for any model written as a chain of stages
// (nn::StagedModel: embed -> blocks -> head, and its loss; docs/parallel.md,
// "Pipeline parallelism"): the pieces of this folder put together for a
// training loop.
//
//   std::shared_ptr<MyModel> model;                          // this rank's own instance
//   { nn::ConstructionScope meta(kMeta); model = nn::make_model<MyModel>(...); }  // or materialised, with values
//   Pipeline pipe(model, mesh /* with a "pp" dim */, plan, seed, micro_batches, opts);
//   nn::AdamW opt(pipe.param_groups(weight_decay), ...);   // this rank's parameters only
//   for (step ...) {
//     auto r = pipe.train_step(seed, step, global_batch, micro_batches_of_the_step);
//     double norm = pipe.clip_grad_norm_(1.0);              // all stages' gradients
//     opt.step(); opt.zero_grad();
//   }
//
// Every rank of the mesh calls every method in the same order (they are
// collective) and passes a model built the same way. Errors before any
// work: the schedule's rules (micro-batches vs pp, virtual stages) are
// checked and the schedule is verified (check_schedule) before the model is
// touched; the stage checks the blocks fill pp x V stages and every
// parameter belongs to one (stage.h).
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

// One micro-batch as the data loader gives it: plain tensors, full on every
// rank, dim 0 the batch (a language model: token ids [b, T]; any dtype).
struct MicroBatch {
  Tensor inputs;             // what embed() takes
  Tensor targets;            // what stage_loss() compares the head's output with
  int64_t first_sample = 0;  // global index of row 0 (dropout masks are keyed by it)
};

struct PipelineStepResult {
  double loss = 0;                 // mean over the micro-batches of the whole model's loss() (every rank)
  double loss_sum = 0;             // their sum (bitwise mode: the one-device loop's bits)
  std::optional<double> aux_loss;  // the last micro-batch's aux loss summed over all blocks (when blocks produce one)
  double comm_wait_s = 0;          // this rank's time blocked in point-to-point transfers
  double comm_wait_mean_s = 0;     // the same, averaged over the ranks of this rank's pp group
  std::optional<int64_t> moe_dropped_tokens;  // models with MoE layers: slots over capacity, all stages and micro-batches
  // The last stage's micro-batch losses (stage_loss + aux x coef, unscaled,
  // detached), in micro-batch order; empty on the other pp ranks. Compile
  // mode reads them again after a replay (replayed_step).
  std::vector<Tensor> stage_losses;
};

class Pipeline {
 public:
  // `model`: this rank's instance of the plain model, on Meta or materialised;
  // the stage edits it in place (PipelineStage). `seed` initialises the Meta
  // parameters this rank holds (from (seed, path): the single-device values).
  Pipeline(std::shared_ptr<nn::StagedModel> model, const MeshPtr& mesh, const ParallelPlan& plan, uint64_t seed,
           int64_t micro_batches, const PipelineOptions& opts);

  const PipelineStage& stage() const { return *stage_; }
  const Schedule& schedule() const { return schedule_; }
  const ScheduleStats& schedule_stats() const { return stats_; }
  // The whole model: this rank's parts materialised, the others Meta.
  nn::StagedModel& model() const { return stage_->model(); }

  // AdamW's default groups (decay / no decay) restricted to this rank's parameters.
  std::vector<nn::ParamGroup> param_groups(double weight_decay) const;
  // Bytes of this rank's parameter pieces.
  int64_t local_parameter_bytes() const;

  // Forwards and backwards of one step's micro-batches; gradients are left
  // accumulated in this rank's parameters (scaled by 1 / M).
  PipelineStepResult train_step(uint64_t seed, uint64_t step, int64_t global_batch,
                                const std::vector<MicroBatch>& micro_batches);
  // Sums the tied parameters' gradients over their holders (once per
  // step: later calls do nothing until the next train_step). clip_grad_norm_
  // calls it; call it first to touch the complete gradients before that
  // (GradScaler::unscale_).
  void finish_gradients();
  // Compile mode (docs/compile.md): the step's kernels and collectives were
  // replayed instead of train_step, leaving the gradients and, on the last
  // stage, the micro-batch losses `stage_losses` (train_step's, in the
  // program's buffers; empty elsewhere). What train_step does after its
  // schedule, on the host and over pp: the loss sums (bitwise mode: the
  // one-device arithmetic), and the tied gradients marked unsummed.
  // Collective over the pp ranks. Models with MoE layers are not replayed.
  PipelineStepResult replayed_step(const std::vector<Tensor>& stage_losses, int64_t micro_batches);
  // Loss scaling for the following train_steps: the backward starts from
  // each micro-batch's loss / M times `scale` (nullopt: none).
  void set_loss_scale(std::optional<double> scale);
  // Sums tied gradients over their holders, then the global L2 norm of all
  // stages' gradients (each parameter counted once), combined in the order of
  // nn::clip_grad_norm_ over the whole model (the same bits for the same
  // gradients); with max_norm > 0 clips every gradient by the same factor.
  // Returns the norm.
  double clip_grad_norm_(double max_norm);

  // Inputs [B, ...] (laid out) -> the head's output on every rank
  // (evaluation, sampling; no grad). A language model: logits.
  Tensor forward(const Tensor& inputs);
  // The plan's layout of a batch of inputs or targets on the stage mesh.
  Tensor layout(const Tensor& batch) const { return stage_->layout(batch); }

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
  bool tied_synced_ = false;  // finish_gradients ran since the last train_step
  // After the schedule: the loss sums over pp (a host value each; not part
  // of a compiled step).
  PipelineStepResult summarize(const StepStats& st, size_t micro_batches) const;
};

}  // namespace tessel::parallel::pipeline
