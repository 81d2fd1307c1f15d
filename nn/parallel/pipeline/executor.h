#pragma once
// The one executor: runs any schedule's instruction list (schedule.h) for
// this rank's stage (stage.h).
//
// Per instruction:
//   Forward c mb   under micro-batch mb's ForwardScope (its global batch
//                  offset, so dropout masks are the single-device slices) and
//                  autocast: vs 0 embeds the inputs, then the chunk's blocks
//                  run; the last stage applies the head and computes
//                  (stage_loss + aux x coef) / M. Each block's auxiliary loss
//                  (block_aux_loss: Mixtral's router loss) is added where the
//                  block runs, scaled by aux_loss_coef() / M.
//   RecvAct        the input arrives as a leaf requiring grad (p2p.h)
//   SendAct        also posts the receive of the output's gradient, so
//                  RecvGrad only waits for it (check_schedule guarantees each
//                  chunk's backwards come in the order of its forwards)
//   Backward c mb  autograd::backward({output, aux}, {received grad, 1}) (the
//                  last stage: from its scaled loss); the input leaf's .grad()
//                  is kept for SendGrad. Activations are dropped after it.
// Tags: activations into stage vs use tag vs, gradients into vs tag S + vs.
#include <optional>
#include <vector>

#include "nn/context.h"
#include "nn/parallel/pipeline/p2p.h"
#include "nn/parallel/pipeline/schedule.h"
#include "nn/parallel/pipeline/stage.h"

namespace tessel::parallel::pipeline {

// A micro-batch as the executor runs it.
struct LaidOutMicroBatch {
  Tensor inputs, targets;  // laid out on the stage mesh (PipelineStage::layout); no targets in forward-only runs
  nn::ForwardContext ctx;  // seed, step, this micro-batch's global offset, the global batch
};

struct StepStats {
  double loss_sum = 0;     // this rank's share of sum_m loss_m (stage_loss on the last stage, aux x coef)
  double aux_last = 0;     // sum over this rank's blocks of the last micro-batch's aux loss (unscaled)
  bool has_aux = false;
  double comm_wait_s = 0;  // time blocked in point-to-point transfers
  int64_t moe_dropped = 0;  // token slots over capacity in this rank's MoE layers, all micro-batches
  bool has_moe = false;     // this rank ran an MoE layer
  // Per micro-batch pieces of the loss for bitwise mode, each with its dtype
  // (DType + 1; 0 where another rank computes the piece or a block produced
  // no aux loss, whose value is then -0.0): the stage loss [m] and the block
  // aux losses [m][blocks]. Values as double (exact for every float dtype).
  std::vector<double> stage_loss, block_aux;
  std::vector<double> stage_loss_dtype, block_aux_dtype;
  // The last stage's micro-batch losses (unscaled, detached), [m]; empty on
  // the other stages. Compile mode keeps them as the step's outputs.
  std::vector<Tensor> losses;

  // Empty statistics for a step of `micro_batches` over a model of `blocks` blocks.
  StepStats(size_t micro_batches, size_t blocks);
  // The last stage's micro-batch `mb`: its stage loss and its whole loss
  // (the stage loss plus the aux losses x coef; the same tensor without
  // them). Their values are read on the host outside any recording (compile
  // mode reads them again after a replay: Pipeline::replayed_step).
  void add_loss(size_t mb, const Tensor& stage, const Tensor& loss);
};

class Executor {
 public:
  // `compute`: the autocast dtype of training forwards (Float32: none).
  Executor(const PipelineStage& stage, DType compute);

  // One training step: forwards and backwards of every micro-batch, leaving
  // this rank's parameter gradients accumulated (tied ones not yet summed).
  StepStats run(const Schedule& s, const std::vector<LaidOutMicroBatch>& micro_batches);

  // Loss scaling (nn::GradScaler, float16): the backward roots are the
  // micro-batch losses / M times this scale; nullopt: none.
  void set_loss_scale(std::optional<double> scale) { loss_scale_ = scale; }

  // The head's output for `inputs` (laid out) on every pp rank, no grad: the
  // forward-only schedule, then a broadcast from the last stage (collective
  // over the mesh).
  Tensor forward(const Tensor& inputs);

 private:
  struct Slot {
    Tensor input;     // received activation (leaf), or empty on stage 0
    Tensor output;    // stage output kept for backward; the head's output in forward-only runs
    Tensor root;      // the last stage's scaled loss
    Tensor aux_root;  // this chunk's aux loss x coef / M
    P2P::PendingRecv pending_grad;  // gradient of output, posted at SendAct
    Tensor grad_out;                // ... received (RecvGrad)
    Tensor grad_in;   // gradient of input to send
  };
  void exec(const Schedule& s, const Instr& in, const std::vector<LaidOutMicroBatch>& mbs, bool training,
            StepStats& st);
  void forward_chunk(int vs, Slot& sl, const LaidOutMicroBatch& b, int mb, int m, bool training, StepStats& st);
  void backward_chunk(int vs, Slot& sl);

  const PipelineStage& stage_;
  DType compute_;
  std::optional<double> loss_scale_;
  P2P p2p_;
  std::vector<Slot> slots_;  // [chunk * M + mb], reused across steps
};

}  // namespace tessel::parallel::pipeline
