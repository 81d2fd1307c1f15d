#pragma once
// Mixed mode: chosen modules compiled, the rest of the step eager
// (docs/compile.md, "Mixed mode").
//
// A module marked with UnaryModule::set_compiled(true) -- or every block, or
// every nn::Attention, with apply_compile_modules (RunOptions::
// compile_modules, `tessel train --compile-modules`) -- runs its first
// training call eagerly; its second and third calls run eagerly under a
// capture::Recorder, each recording the module's forward and, when the
// engine reaches it, its backward (the kernels autograd::grad runs through
// the module's graph: the gradients of its input and its parameters). When
// the two recordings agree, later calls replay them: the forward's launches
// at the call, the backward's when the engine reaches the module. The rest
// of the step -- the model around the module, the loss, the optimizer --
// runs eagerly, and may do what a whole-step recording refuses (read a value
// on the host, route tokens to experts).
//
// Same bits as eager: the module is one node of the step's graph whose
// backward backpropagates through the module's own graph into its input
// and parameters, as activation recomputation does (nn/recompute.h); a
// replay runs the recorded kernels on the recorded buffers.
//
// Guards, never a stale replay: each call compares its input's shape, dtype
// and device, whether it and each parameter require gradients, the
// parameter tensors themselves, train()/eval() of every module inside, the
// numerics settings and the autocast dtype with the recording's; a
// difference records again (`recaptures`). A module whose recording cannot
// be replayed faithfully (a host read of a computed value, data-dependent
// host work, the two recordings differ) runs eagerly for good,
// with a warning and the reason in its stats. Calls without gradients
// (eval, NoGradGuard) run eagerly; so does a second call of the module
// before the first one's backward (the recording's buffers are in use:
// pipeline schedules, a module applied twice in one forward).
//
// On a mesh every rank records and replays its own piece of the module,
// the collectives inside it included (tensor and sequence parallel layers,
// context-parallel attention); the output and gradients it hands out are
// distributed as eager's were. Every rank that runs the module agrees on a
// refusal (one small all-reduce per recording): a rank running the module
// eagerly while another replays would reach the collectives of the backward
// and the data-parallel reductions in another order.
//
// The module's forward hooks run eagerly around the recorded or replayed
// forward, at every call (they are the caller's host work: FSDP gathers
// the parameters in them, a module layout redistributes), so a recording
// reads what the pre-hooks installed -- FSDP's gathered copies, whose
// gradients the replayed backward hands to FSDP's gather node.
//
// This version: CPU tensors (a CUDA input or parameter runs eagerly, with
// the reason); not with recomputation of the same module (inside a
// recomputed module, the recomputation's call records and replays); not
// inside a whole-step recording (RunOptions::compile), where the module is
// recorded with the step anyway.
#include <cstdint>
#include <string>

namespace tessel::nn {

class Module;

// What mixed mode did for one module (or, summed, for a model).
struct ModuleCompileStats {
  int64_t modules = 0;      // modules marked (sums)
  int64_t calls = 0;        // training calls (gradients on)
  int64_t replayed = 0;     // calls replayed
  int64_t recordings = 0;   // calls recorded
  int64_t recaptures = 0;   // recordings started again after a change (shape, parameters, mode)
  int64_t busy = 0;         // calls run eagerly while the module's recording was in use
  int64_t launches = 0;     // launches per replayed call (forward and backward)
  int64_t buffer_bytes = 0;  // bytes the recordings' buffers take in a replayed call
  int64_t held_bytes = 0;    // of those, what they hold now (between calls: the input buffers; the arenas go back)
  std::string refused;       // why a module runs eagerly for good (the first such module's; "" if none)
};

// Which modules apply_compile_modules marks: none, every nn::Attention
// ("attention"), every block of an nn::StagedModel ("blocks").
enum class CompileModules { None, Attention, Blocks };
// "none" | "attention" | "blocks"; anything else is an error naming the three.
CompileModules parse_compile_modules(const std::string& name);
const char* compile_modules_name(CompileModules which);

// Marks (or, with None, unmarks) the modules; returns how many. "blocks" on
// a model that is not an nn::StagedModel, a model with nothing to mark, and
// a module also marked for recomputation, are errors.
int apply_compile_modules(Module& model, CompileModules which);

// Summed over the compiled modules under `root` (refused: the first reason).
ModuleCompileStats compiled_module_stats(const Module& root);

// Every compiled module under `root` records again at its next training
// call (a replay would not see host state of a module's own that changed:
// a dropout rate set by hand, a flag its forward reads). RunBase::
// record_again calls it.
void record_modules_again(const Module& root);

}  // namespace tessel::nn
