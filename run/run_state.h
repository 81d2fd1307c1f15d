#pragma once
// The state behind a tessel::Run (run.h): what parallelize built, and the
// step's bookkeeping. Internal to run/ (run.cc, checkpoint.cc); users see
// RunBase's methods.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "autograd/anomaly.h"
#include "autograd/ops/attention.h"
#include "nn/parallel/pipeline/pipeline.h"
#include "run/run.h"
#include "runtime/capture.h"
#include "runtime/numerics.h"
#include "runtime/timeline.h"

namespace tessel::checkpoint {
class Saver;
}

namespace tessel {

class RunState {
 public:
  RunState() = default;
  ~RunState();
  RunState(const RunState&) = delete;
  RunState& operator=(const RunState&) = delete;

  std::shared_ptr<nn::Module> model;
  std::string model_type;  // the model's type_name(), for messages and checkpoints
  MeshPtr mesh;            // null: one device
  parallel::ParallelPlan plan;
  RunOptions options;
  OptimizerSpec spec;
  RunLossFn loss;

  std::unique_ptr<parallel::pipeline::Pipeline> pipe;  // a "pp" dim
  std::unique_ptr<parallel::DataParallel> dp;          // a "dp" dim (without pp)
  std::unique_ptr<nn::Optimizer> opt;
  std::vector<Tensor> params;  // what the gradient norm covers (dp: what this rank updates)
  std::vector<std::string> param_paths;  // the model's parameter paths after layout
  std::vector<const TensorImpl*> param_impls;  // and the tensors in those slots
  std::vector<const nn::ParameterSlot*> param_slots;  // and the slots (the check's fast path)

  std::optional<nn::GradScaler> scaler;  // RunOptions::loss_scaling
  std::optional<anomaly::Guard> anomaly;  // RunOptions::detect_anomaly
  std::optional<double> last_loss;        // forward_backward's, for the non-finite gradient message
  int64_t scaled = 0;  // scale_loss() calls in this step (loss scaling: each backward needs one)

  int64_t step = 0;   // optimizer steps done
  int64_t micro = 0;  // backward passes begun in this step
  int64_t inputs = 0;  // input() calls in this step (a data-parallel step without any is worth a warning)
  bool warned_no_input = false;
  bool dp_finished = false;  // compile mode: forward_backward ran dp->finish() already
  bool cp_checked = false;  // the first step's context-parallel attention was checked
  bool parameters_checked = false;  // the first step found every parameter set (finite)
  ContextParallelAttentionCount cp_at_start;  // this thread's count when the Run was made
  int observer = 0;   // backward observer handle (0: none)
  nn::ForwardContext caller_context;  // the thread's forward context before the Run set its own
  std::unique_ptr<checkpoint::Saver> saver;  // async checkpoints (checkpoint.cc), created on first use

  // RunOptions::trace: this rank's timeline, recording while trace_scope is set.
  std::unique_ptr<timeline::Recorder> trace;
  std::optional<timeline::Scope> trace_scope;
  int64_t trace_first_step = -1;  // step() when the first traced step began (-1: none yet)
  int64_t trace_step_start_ns = 0;  // where the current step's span begins
  std::string trace_written;        // the merged file, on the rank that wrote it
  // Ends the recording and writes the files: collective with merge, else
  // this rank's file only (a Run destroyed before write_trace).
  std::string finish_trace(bool merge);

  // RunOptions::compile (run.cc "compile mode").
  struct Compiled {
    bool warmed_up = false;  // the first step ran eagerly
    bool forward_backward_this_step = false;
    bool warned_own_loop = false;  // compile is set but the loop does not use forward_backward
    std::unique_ptr<capture::Program> previous;  // the first of two recordings, until the second agrees
    std::unique_ptr<capture::Program> program;   // the recording replayed
    std::vector<int> prev_outputs;               // the first recording's buffers of the losses, then the gradients (-1: none)
    std::vector<Tensor> losses;                  // the recorded losses (views to read after a replay)
    std::vector<std::pair<Tensor, Tensor>> grads;  // (parameter, its recorded gradient)
    std::vector<std::vector<Tensor>> tied;         // pipeline, bitwise: the tied gradients' per-micro-batch pieces
    // How the losses and gradients lie in the program's buffers, until the
    // first replay makes the views above (the arena exists from then on).
    struct OutputLayout {
      capture::OutputLayout where;  // the local piece's buffer view, and how to wrap it
      int param = -1;               // a gradient's parameter (index into params), -1: a loss
      int contribution = -1;        // >= 0: micro-batch k's gradient of a tied parameter (a pipeline in bitwise mode)
    };
    std::vector<OutputLayout> output_layouts;
    std::vector<const StorageImpl*> param_storages;  // the parameters recorded
    std::vector<char> module_state;  // train()/eval() of each module, requires_grad of each parameter
    bool record_again = false;       // RunBase::record_again()
    Dims input_shape, target_shape;
    DType input_dtype = DType::Float32, target_dtype = DType::Float32;
    numerics::Settings numerics;  // bitwise mode, V, GEMM mode: the kernels' arguments depend on them
    double loss_scale = 0;        // loss scaling's scale when recorded (0: none)
    std::optional<DType> autocast;  // the thread's autocast around forward_backward when recorded (nn::AutocastScope)
    CompileStats stats;
  } compiled;

  // A backward pass begins on this thread.
  void on_backward();
  // Sets the thread's forward context to {seed, step} (between steps).
  void set_step_context() const;
  // The parameters the model holds now: the paths and the very tensors
  // parallelize laid out (to catch ones added, removed or assigned anew).
  void check_parameters_unchanged() const;
  // Throws unless every rank passed the same `full` to input() (one all-reduce).
  void check_same_on_every_rank(const Tensor& full) const;
  // input()'s checks and count.
  void accept_input(const Tensor& full);
};

}  // namespace tessel
