#pragma once
// A parallel plan derived from the model itself, not from its names: one
// forward is traced on the Meta device (no memory, no kernels) and the
// autograd graph it records is read for Megatron's patterns (docs/parallel.md
// "Plans derived from the model"):
//
//   * column -> row pairs: a Linear whose output reaches another Linear's
//     input only through ops that act per feature (activations, dropout,
//     products of two such outputs as in SwiGLU, a bias or scale, reshapes
//     into heads, transposes, rotary embeddings, fused attention over heads,
//     norms over a head's own dims). The first ones are column parallel
//     (output features sharded over tp), the last row parallel (its partial
//     products summed once). Attention's q/k/v -> o is one such pair: heads
//     over tp, whole KV heads per rank.
//   * the LM head: a Linear whose output reaches cross_entropy's scores the
//     same way is column parallel (vocabulary-sharded logits), and an
//     embedding with that vocabulary is vocabulary parallel.
//   * experts: every nn::MoE layer's experts over ep.
//   * with sequence_parallel: the token embedding's output is sharded along
//     the sequence (dim 1 of [B, T, C]) over tp, each sublayer that holds a
//     column/row pair (the block's child containing it) gathers its input and
//     scatters its output, and the norm before the LM head gathers again. A
//     pair whose Linears are the block's own children has no sublayer: its
//     column layers gather their input and its row layers scatter their
//     output themselves.
//
// A Linear that fits no pattern stays replicated, and the report says why
// (what its output met). Placements never change what a model computes in
// tessel -- every op's sharding rule gives the one-device values, in bitwise
// mode the same bits -- so a pattern missed costs speed, never correctness.
//
// The three shipped plans come out of this unchanged (test_derive_plan:
// plan_layout(derived) == plan_layout(builtin) for nanogpt, llama, mixtral).
#include <functional>
#include <string>
#include <vector>

#include "nn/module.h"
#include "nn/parallel/plan.h"
#include "nn/staged.h"

namespace tessel::parallel {

struct DeriveOptions {
  bool sequence_parallel = false;
  std::string tp = "tp";  // the mesh dim of tensor (and sequence) parallelism
  std::string ep = "ep";  // the mesh dim experts spread over
  std::string name = "derived";
};

// What the trace found, for people: one line per pattern, and each Linear
// (or matmul with a parameter) left replicated with the reason.
struct DeriveReport {
  std::vector<std::string> found;
  std::vector<std::string> replicated;
  std::string str() const;
};

// `forward` runs the model once and returns a tensor that depends on its
// parameters (the loss, usually); it is traced, not trained. Give it inputs
// on the Meta device (empty({B, T}, TensorOptions(DType::Int64).with_device(kMeta)));
// a model with real parameters is traced on Meta stand-ins of them, put back
// afterwards (values untouched). The model must not be laid out yet.
ParallelPlan derive_plan(nn::Module& model, const std::function<Tensor()>& forward, const DeriveOptions& options = {},
                         DeriveReport* report = nullptr);
// An nn::StagedModel, traced on two sequences shaped like its example_input().
ParallelPlan derive_plan(nn::StagedModel& model, const DeriveOptions& options = {}, DeriveReport* report = nullptr);

// What a plan does to `model`, one line per parameter it shards, per module
// rule that applies and per MoE layer whose experts it spreads, sorted: two
// plans with the same layout lay every mesh out the same, however their
// regexes are written.
std::string plan_layout(const ParallelPlan& plan, const nn::Module& model);

}  // namespace tessel::parallel
