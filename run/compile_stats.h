#pragma once
// What compile mode did (RunOptions::compile; docs/compile.md). Its own
// header so that reports (the trainer's TrainResult) carry it without the Run.
#include <cstdint>
#include <string>

#include "nn/compiled_module.h"

namespace tessel {

// What compile mode did (RunBase::compile_stats).
struct CompileStats {
  bool enabled = false;    // RunOptions::compile
  bool replaying = false;  // a recording is in use
  // Steps run eagerly: forward_backward's warm-up, recordings and steps after a
  // refusal, and steps whose backward ran in a loop of one's own (not recorded).
  int64_t eager_steps = 0;
  int64_t captures = 0;     // recordings made
  int64_t replays = 0;      // steps replayed
  int64_t recaptures = 0;   // recordings dropped for new input shapes or replaced parameters
  int64_t launches = 0;     // launches in the recording in use (kernels, collectives, waits, checks)
  int64_t buffer_bytes = 0;  // bytes the recording's buffers use in a replay
  int64_t held_bytes = 0;    // of those, held now (between steps the arenas are given back: docs/compile.md)
  int64_t fused_chains = 0;    // runs of elementwise launches replayed as one pass (RunOptions::compile_fusion)
  int64_t fused_launches = 0;  // the launches in them
  // Device graphs (RunOptions::compile_graphs; a GPU only): the graphs in
  // use and the launches in them, captures made, launches a capture refused
  // (they run from the host) and why, the last time.
  int64_t graphs = 0;
  int64_t graph_launches = 0;
  int64_t graph_captures = 0;
  int64_t graph_refused = 0;
  std::string graph_refusal;
  std::string refused;       // why compile mode stopped (empty: it did not)
  // Mixed mode (RunOptions::compile_modules): the compiled modules, summed.
  nn::ModuleCompileStats modules;
};

}  // namespace tessel
