#pragma once
// tessel::Run: a model written for one device, laid out on a mesh, with its
// optimizer -- the public training API (docs/your_model.md). The loop a user
// writes for one device is the loop for every layout:
//
//   auto model = nn::make_model<MyNet>(cfg);          // plain single-device code
//   model->reset_parameters(seed);                    // (or build it on Meta)
//   MeshPtr mesh = Mesh::world({{"dp", 2}, {"tp", 2}});
//   auto run = tessel::parallelize(model, mesh, plan, tessel::adamw({/*lr=*/1e-3}), {/*zero=*/2, /*clip=*/1.0});
//   for (int64_t step = run.step(); step < steps; ++step) {
//     Tensor x = run.input(xs), y = run.input(ys);     // the global batch, the same on every rank
//     Tensor loss = run.model().loss(x, y);           // any method, any signature
//     loss.backward();
//     run.step_optimizer();                           // reduce, clip, step, re-gather, zero
//   }
//
// What parallelize does, in order: checks the mesh against the plan (every
// mesh dim of size > 1 must mean something: "dp", "pp", a dim the plan
// names); lays the model out (parallel::parallelize: tensor/sequence/expert
// parallel by the plan; a "pp" dim: the model's stages, nn::StagedModel);
// materialises and initialises a model built on Meta (only this rank's
// pieces, values those of the single-device model with RunOptions::seed);
// sets up data parallelism over "dp" (DDP, ZeRO-1/2, FSDP by
// RunOptions::zero); builds the optimizer over what this rank updates. The
// model's tensors are replaced on the way: an optimizer built over the old
// ones fails at its first step, naming the parameter.
//
// During a step the Run keeps count: every backward() on this thread is one
// micro-batch (autograd backward observers); data parallelism reduces on the
// last one (RunOptions::micro_batches); a backward beyond that, or a step
// without one, is an error. The thread's forward context (nn/context.h:
// dropout keys) is {seed, step} between steps, so dropout draws a new mask
// every step with no code in the loop; micro-batches that need their place in
// the global batch open a scope with forward_context(first_sample, batch).
//
// forward_backward(inputs, targets) runs a whole step's forwards and
// backwards for any layout, pipelines included: the loop for models with a
// standard loss (nn::StagedModel, or a `loss(x, y)` method).
//
// Numerics (bitwise mode, V, GEMM mode) are the thread's: set them before the
// ranks start (tessel::launch / comm::run_local copy the caller's to every
// rank; ranks that disagree fail at their first collective).
//
// Every rank calls every method in the same order (they are collective).
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dtensor/mesh.h"
#include "nn/context.h"
#include "nn/grad_scaler.h"
#include "nn/module.h"
#include "nn/optim.h"
#include "nn/parallel/data_parallel.h"
#include "nn/parallel/plan.h"
#include "nn/compiled_module.h"
#include "nn/recompute.h"
#include "nn/schedule.h"
#include "run/compile_stats.h"

namespace tessel {

namespace parallel::pipeline {
class Pipeline;
}

// How to build the optimizer once the model is laid out.
struct OptimizerSpec {
  std::string name;  // for messages and checkpoints ("adamw")
  // The parameter groups, from the laid-out model (its parameters are the
  // laid-out tensors when this runs). Default: nn::default_param_groups with
  // the optimizer's weight decay.
  std::function<std::vector<nn::ParamGroup>(const nn::Module& model)> groups;
  // The optimizer over the groups as this rank updates them (ZeRO-1/2: its dp
  // chunks; a pipeline: its stage's parameters).
  std::function<std::unique_ptr<nn::Optimizer>(std::vector<nn::ParamGroup> groups)> make;
};

// AdamW / SGD over two groups: "decay" (matrices, embeddings) with the
// options' weight decay and "no_decay" (biases, norms) without.
OptimizerSpec adamw(const nn::AdamWOptions& options = {});
OptimizerSpec sgd(const nn::SGDOptions& options = {});

struct RunOptions {
  int zero = 0;               // data parallelism over "dp": 0 DDP, 1 ZeRO-1, 2 ZeRO-2, 3 FSDP
  double clip = 0;            // clip the global gradient norm to this; 0: no clipping (the norm is still reported)
  int64_t micro_batches = 1;  // backward passes per optimizer step (gradient accumulation)
  uint64_t seed = 0;          // dropout keys (nn/context.h); the initial values of a model built on Meta
  std::optional<nn::LrSchedule> lr_schedule;  // the rate of each step; unset: the optimizer's own
  // FSDP units (zero = 3; ignored otherwise): a regex on module paths (whole
  // match), e.g. "blocks\\.\\d+". Empty: an nn::StagedModel's blocks(), else one
  // unit (the whole model).
  std::string fsdp_units;
  double bucket_mb = 25;  // DDP/ZeRO bucket size
  // input() checks that every rank passed the same global batch (one small
  // all-reduce of a hash per call): a rank passing its own rows instead --
  // the habit of other frameworks -- would silently drop data.
  bool check_inputs = true;
  // forward_backward: autocast dtype of the forwards (Float32: none).
  DType compute = DType::Float32;
  // Dynamic loss scaling (nn::GradScaler), for float16 compute: the loss is
  // multiplied by the scale before backward (forward_backward does it; a
  // loop of your own backpropagates run.scale_loss(loss)), step_optimizer
  // divides the gradients by it and skips the step -- parameters and
  // optimizer state untouched, step() still advances -- when any rank's
  // gradients hold an inf or NaN, then updates the scale. Unset: none.
  std::optional<nn::GradScalerOptions> loss_scaling;
  // A "pp" mesh dim (the model must be an nn::StagedModel):
  std::string pipeline_schedule = "1f1b";  // gpipe | 1f1b | interleaved
  int virtual_stages = 0;                  // 0: 2 for interleaved, else 1
  std::string pipeline_split = "layers";   // layers | params
  // Anomaly detection (autograd/anomaly.h) on the thread that called
  // parallelize, for the Run's lifetime: the first op, backward node or
  // optimizer update that yields an inf or NaN stops the run with an
  // anomaly::AnomalyError naming it (step, rank, module, inputs). Slow: every
  // op's outputs are read once more. For finding a NaN, not for training.
  bool detect_anomaly = false;
  // step_optimizer throws before the update when the global gradient norm is
  // inf or NaN (a loss-scaled step that skips is not an error): parameters
  // and optimizer state stay those of the previous step. false: train on.
  bool stop_on_nonfinite = true;
  // Activation recomputation (nn/recompute.h): none, selective (every
  // nn::Attention's core) or full (every block of an nn::StagedModel keeps
  // only its input). Same bits as none; not with zero = 3.
  nn::Recompute recompute = nn::Recompute::None;
  // A timeline of the run (docs/trace.md): with a path, every rank records
  // its ops, backward nodes, collectives (bytes, group, peers), waits,
  // pipeline instructions and allocator samples on the thread that called
  // parallelize, for trace_steps optimizer steps (0: until write_trace()).
  // Then every rank writes `trace` with ".rank<r>" before the extension, and
  // rank 0 writes `trace` itself: all ranks merged, one track each, for
  // chrome://tracing or ui.perfetto.dev.
  std::string trace;
  int64_t trace_steps = 3;
  // Compile mode (docs/compile.md): forward_backward runs its first step
  // eagerly, records the kernels of steps 2 and 3 while running them, and
  // when the two recordings agree replays the recording from step 4 on -- no
  // sharding propagation, no autograd graph, no allocation; the same kernels
  // on the same buffers, so the same bits as eager. A step that cannot be
  // recorded faithfully (a host read of a computed value, a per-step value
  // with no producer, data-dependent work) runs eagerly from then on, with
  // a warning and the reason in compile_stats(); new input shapes or
  // replaced parameters (or a new loss scale) record again. On a mesh every
  // rank records and replays its collectives too. A model with MoE layers
  // (host routing) is split around them: its attention layers compiled
  // (compile_modules = attention), the rest eager. Not with anomaly
  // detection.
  bool compile = false;
  // Compile mode's fusion (docs/compile.md, "Fusion"): runs of elementwise
  // kernels are replayed tile by tile, as one pass over memory (the same
  // bits). false: every launch replays alone -- to measure what fusion
  // gives, or to rule it out.
  bool compile_fusion = true;
  // Compile mode on a GPU (docs/compile.md, "On a GPU"): the replay's runs
  // of kernels are captured into CUDA graphs and launched as one each (the
  // same kernels on the same buffers: the same bits). false: every kernel
  // is launched from the host. No effect on the CPU. The environment
  // variable TESSEL_CUDA_GRAPHS=0 turns graphs off for the whole process.
  bool compile_graphs = true;
  // Mixed mode (nn/compiled_module.h, docs/compile.md "Mixed mode"): none,
  // attention (every nn::Attention) or blocks (every block of an
  // nn::StagedModel) are recorded and replayed, forward and backward, while
  // the rest of the step runs eagerly -- MoE layers, a loss that reads
  // values on the host. Same bits as eager, on every layout (FSDP and
  // recomputation included); not with compile or anomaly detection, nor
  // blocks with recompute = full (a block is recomputed or compiled).
  nn::CompileModules compile_modules = nn::CompileModules::None;
};

// What step_optimizer did.
struct StepReport {
  int64_t step = 0;      // steps done, this one included
  double grad_norm = 0;  // global L2 norm of the gradients before clipping (unscaled)
  double lr = 0;         // the rate this step used
  // Loss scaling only: the scale this step's backward used, and whether
  // the step was skipped (an inf or NaN gradient on some rank).
  double loss_scale = 1;
  bool skipped = false;
};

// What forward_backward computed.
struct StepLoss {
  double loss = 0;      // mean over the micro-batches of the model's loss
  double loss_sum = 0;  // their sum (in bitwise mode, the one-device loop's bits)
  std::optional<double> aux_loss;  // pipelines of models with auxiliary losses: the last micro-batch's
  double comm_wait_s = 0;          // pipelines: this rank's time blocked in transfers
  double comm_wait_mean_s = 0;     // pipelines: the same averaged over the pp ranks
  std::optional<int64_t> moe_dropped_tokens;  // models with MoE layers: token slots over capacity, all micro-batches
};

class RunState;
// Owns a RunState (defined in run/run_state.h; deleted in run.cc, so the
// templates below never need its definition).
struct RunStateDeleter {
  void operator()(RunState* s) const;
};
using RunStatePtr = std::unique_ptr<RunState, RunStateDeleter>;

// The part of a Run that does not depend on the model's type.
class RunBase {
 public:
  RunBase(RunBase&&) noexcept;
  RunBase& operator=(RunBase&&) noexcept;
  ~RunBase();

  // Optimizer steps taken (restored by tessel::load).
  int64_t step() const;
  // Null on one device.
  const MeshPtr& mesh() const;
  const parallel::ParallelPlan& plan() const;
  const RunOptions& options() const;
  nn::Module& module() const;
  nn::Optimizer& optimizer() const;
  // Null without a "dp" dim of size > 1 (or with a pipeline, which reduces its own dp gradients).
  parallel::DataParallel* data_parallel() const;
  // Null without a "pp" dim.
  parallel::pipeline::Pipeline* pipeline() const;

  // ---- inputs --------------------------------------------------------------------
  // `full` (the global batch, dim 0 = samples, identical on every rank) laid
  // out by the plan's data layout ("dp" and "ep": Shard(0), "cp": Shard(1) --
  // time -- for tensors that have a dim 1, other dims Replicate): each rank
  // keeps its piece. Any dtype (token ids, floats,
  // masks). On one device: `full` itself. Ranks that pass different tensors
  // get an error (RunOptions::check_inputs).
  Tensor input(const Tensor& full) const;
  // The same with an explicit layout, e.g. {{"dp", Shard(0)}, {"tp", Shard(1)}}.
  Tensor input(const Tensor& full, const parallel::DimLayout& layout) const;

  // The forward context of micro-batch rows [first_sample, ...) of a global
  // batch of `global_batch` rows at the current step (for nn::ForwardScope).
  nn::ForwardContext forward_context(int64_t first_sample = 0, int64_t global_batch = -1) const;

  // ---- the step ------------------------------------------------------------------
  // After the step's micro-batches: finishes the gradient reduction, clips,
  // sets the rate, steps the optimizer, re-gathers (ZeRO), zeroes the
  // gradients, and advances step().
  StepReport step_optimizer();

  // `loss` times the loss scale (RunOptions::loss_scaling), to backpropagate
  // in a loop of your own; `loss` itself without loss scaling.
  Tensor scale_loss(const Tensor& loss);
  // The current loss scale (1 without loss scaling).
  double loss_scale() const;

  // One step's forwards and backwards for any layout: `inputs` / `targets`
  // are the global batch (plain, identical on every rank); it is cut into
  // micro_batches contiguous row ranges, each run under its forward scope and
  // autocast, its loss / micro_batches backpropagated. Needs a loss function
  // (Run<M> sets one for nn::StagedModel and models with loss(x, y)).
  StepLoss forward_backward(const Tensor& inputs, const Tensor& targets);
  // RunOptions::compile: what it did so far.
  CompileStats compile_stats() const;
  // RunOptions::compile: the next forward_backward records again (steps N
  // and N+1), then replays the new recording; mixed mode's compiled
  // modules record again at their next calls. Call it after changing host
  // state the step depends on that no tensor carries -- a flag your loss
  // reads, a schedule of your own: a replay runs the recorded kernels and
  // cannot see such a change. (Modules' train()/eval() and parameters'
  // requires_grad are checked before every replay; no call needed.)
  void record_again();

  // The model's output for `inputs` (global, plain) without grad, on every
  // rank: an nn::StagedModel's head(blocks(embed(x))), through the pipeline
  // when there is one. Evaluation and sampling.
  Tensor forward(const Tensor& inputs);

  // ---- timeline (RunOptions::trace) ---------------------------------------------
  // Ends the trace now, if it is still recording, and writes it (collective:
  // every rank calls it; step_optimizer calls it after trace_steps steps).
  // Returns the merged file's path on the rank that wrote it (rank 0), also
  // once written; "" on the other ranks and without a trace.
  std::string write_trace();

  // ---- inspection ----------------------------------------------------------------
  // Every parameter, full and plain, in model order (collective; a pipeline
  // gathers them on world rank 0 only: the other ranks get an empty list).
  std::vector<std::pair<std::string, Tensor>> full_parameters() const;
  // train/metrics.h param_hash of the whole model (pipelines: rank 0's is the model's).
  std::string param_hash() const;
  // "mesh dp=2 x tp=2 (local backend), plan mlp, ZeRO-2 over dp=2: 2 buckets of <= 25 MiB"
  std::string describe() const;
  // Per-rank bytes of parameters, gradients, optimizer state and buffers.
  parallel::DataParallelMemory memory() const;

  // Internal (checkpoints, Run<M>).
  RunState& state() const { return *state_; }

 protected:
  explicit RunBase(RunStatePtr state);
  RunStatePtr state_;
};

// The loss a Run's forward_backward minimises: loss(model, inputs, targets)
// on one micro-batch, inputs and targets laid out.
using RunLossFn = std::function<Tensor(nn::Module& model, const Tensor& inputs, const Tensor& targets)>;

namespace detail {
RunStatePtr make_run_state(std::shared_ptr<nn::Module> model, MeshPtr mesh, parallel::ParallelPlan plan,
                                         OptimizerSpec optimizer, RunOptions options, RunLossFn loss,
                                         const char* model_type);
template <class M, class = void>
struct has_xy_loss : std::false_type {};
template <class M>
struct has_xy_loss<M, std::void_t<decltype(std::declval<M&>().loss(std::declval<const Tensor&>(),
                                                                     std::declval<const Tensor&>()))>>
    : std::true_type {};
// nn::StagedModel's loss, defined in run.cc (no need to include nn/staged.h here).
RunLossFn staged_loss();
bool is_staged(const nn::Module& m);
}  // namespace detail

template <class M>
class Run : public RunBase {
 public:
  // The user's model, laid out (its parameters are this rank's pieces).
  M& model() const { return static_cast<M&>(module()); }
  std::shared_ptr<M> model_ptr() const { return model_; }

 private:
  template <class N>
  friend Run<N> parallelize(std::shared_ptr<N>, MeshPtr, parallel::ParallelPlan, OptimizerSpec, RunOptions,
                            RunLossFn);
  Run(RunStatePtr s, std::shared_ptr<M> m) : RunBase(std::move(s)), model_(std::move(m)) {}
  std::shared_ptr<M> model_;
};

// Lays `model` out on `mesh` by `plan` and builds its optimizer (see the top
// of this file). `mesh` null: one device (plan ignored). `loss`: what
// forward_backward minimises; default: an nn::StagedModel's loss of its
// output, else `model.loss(inputs, targets)` when M has one.
template <class M>
Run<M> parallelize(std::shared_ptr<M> model, MeshPtr mesh, parallel::ParallelPlan plan, OptimizerSpec optimizer,
                   RunOptions options = {}, RunLossFn loss = nullptr) {
  TESSEL_CHECK(model != nullptr, "tessel::parallelize", "the model is null");
  if (!loss && detail::is_staged(*model)) loss = detail::staged_loss();
  if constexpr (detail::has_xy_loss<M>::value) {
    if (!loss) loss = [](nn::Module& m, const Tensor& x, const Tensor& y) { return static_cast<M&>(m).loss(x, y); };
  }
  auto state = detail::make_run_state(model, std::move(mesh), std::move(plan), std::move(optimizer),
                                      std::move(options), std::move(loss), model->type_name().c_str());
  return Run<M>(std::move(state), std::move(model));
}

// One device. `loss` as above: a step of your own that compile mode records
// (docs/compile.md).
template <class M>
Run<M> parallelize(std::shared_ptr<M> model, OptimizerSpec optimizer, RunOptions options = {},
                   RunLossFn loss = nullptr) {
  parallel::ParallelPlan none;
  return parallelize(std::move(model), MeshPtr(), std::move(none), std::move(optimizer), std::move(options),
                     std::move(loss));
}

}  // namespace tessel
