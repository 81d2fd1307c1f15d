#pragma once
// Activation recomputation (gradient checkpointing): a piece of the forward
// runs without keeping what its backward needs, and runs again when the
// backward reaches it. Memory: the piece keeps only its inputs; time: one
// more forward of the piece.
//
// Policies (RunOptions::recompute, `tessel train --recompute`), applied to an
// nn::StagedModel by apply_recompute:
//   none       nothing is recomputed;
//   selective  the attention core of every nn::Attention (RoPE, the fused
//              attention, the head merge) from the q/k/v projections: the
//              fused kernel keeps no T x T scores, so this saves the
//              attention output and its log-sum-exp per layer, little else
//              (docs/parallel.md has the measured figures);
//   full       every block: a block keeps only its input. A block's
//              auxiliary loss (Mixtral's router loss, read after the
//              block's forward) would be recorded nowhere and carry no
//              gradient: reading it is an error (StagedModel::
//              recorded_block_aux_loss), not a silently dropped term.
//
// Same bits: the replay runs the same ops on the same values, under the
// forward context (nn/context.h: seed, step, the micro-batch's place in the
// global batch) of the first run, so dropout draws the same masks; the
// replayed graph is the recorded graph of a run without recomputation, and
// its gradients flow into the piece's inputs and parameters in the same
// order. In bitwise mode a run with recomputation gives the bits of the run
// without (tests on one device, dp x tp, pp, cp).
//
// Collectives inside a piece (tensor parallel hooks, expert dispatch,
// context-parallel attention) run again in the backward, on every rank in
// the same order. FSDP (ZeRO-3) gathers parameters in module hooks that a
// replay would run out of order: recomputation with it is refused.
#include <functional>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace tessel::nn {

class Module;

enum class Recompute { None, Selective, Full };
// "none" | "selective" | "full"; anything else is an error naming the three.
Recompute parse_recompute(const std::string& name);
const char* recompute_name(Recompute r);

// Runs fn(inputs) without recording and returns its output; when grad mode
// is on and an input or parameter requires grad, the output's backward runs
// fn again (grad mode on, this call's forward context) on the saved inputs
// and backpropagates through the replay into `inputs` and `params` (the
// parameters fn uses). Errors, naming `who`: an input or parameter changed
// in place between the forward and the backward; a parameter gathered by
// FSDP; a replay whose output differs in shape, dtype or placements.
Tensor recompute(const std::string& who, const std::function<Tensor(const std::vector<Tensor>&)>& fn,
                 const std::vector<Tensor>& inputs, const std::vector<Tensor>& params);

// Sets the policy on a model: `full` marks every block of an
// nn::StagedModel (UnaryModule::set_recompute; any other model is an error),
// `selective` every nn::Attention's core, `none` clears both. Returns how
// many pieces it marked.
int apply_recompute(Module& model, Recompute policy);

}  // namespace tessel::nn
