#pragma once
// The trainer's pipeline path (docs/parallel.md, "Pipeline parallelism"),
// kept out of trainer.cc so that the loop there reads the same with and
// without a pipeline: a "pp" dim in --mesh makes run_training build a
// parallel::pipeline::Pipeline instead of a whole model, and each step runs
// its micro-batches through the schedule instead of the plain loop.
#include <memory>

#include "models/config.h"
#include "models/language_model.h"
#include "nn/parallel/pipeline/pipeline.h"
#include "train/config.h"
#include "train/data.h"
#include "train/metrics.h"

namespace tessel::train {

using parallel::pipeline::Pipeline;

// The pipeline of cfg's settings (pipeline_schedule, virtual_stages,
// pipeline_split, micro_batches, dtype) over the language model of `mc`
// (built on Meta: each rank materialises only its stages, initialised from
// cfg.seed), or null when `mesh` has no "pp" dim. Throws before building
// anything when the schedule's rules are broken.
std::unique_ptr<Pipeline> make_pipeline(const TrainConfig& cfg, const models::ModelConfig& mc, const MeshPtr& mesh,
                                        const parallel::ParallelPlan& plan);

// The language model a make_pipeline pipeline runs (this rank's parts
// materialised, the others Meta): the trainer evaluates, checkpoints and
// reports it as the language model it is.
std::shared_ptr<models::LanguageModel> pipeline_language_model(const Pipeline& pipe);

// Forwards and backwards of step `step`'s micro-batches; returns the step's
// loss summed over the micro-batches (as the one-device loop sums them) and adds to `extras`: "aux_loss" (MoE),
// "comm_wait_s" (seconds this rank was blocked in pipeline transfers during
// the forwards and backwards: rank 0's in the metrics) and "comm_wait_mean_s"
// (the same averaged over the pp ranks). Divided by the step time they give
// the share of the step spent waiting, bubble included.
double pipeline_forward_backward(Pipeline& pipe, const TrainConfig& cfg, const DataLoader& loader, int64_t step,
                                 std::vector<std::pair<std::string, double>>& extras);

// param_hash over every parameter of the model (gathered on rank 0; the
// others return the hash of nothing). Moves the whole model over the pp links.
std::string pipeline_param_hash(const Pipeline& pipe);

}  // namespace tessel::train
