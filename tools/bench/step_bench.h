#pragma once
// bench step: one training step of a model (forward + loss, backward, AdamW
// update + zero_grad), timed part by part, against the same model in PyTorch
// on the CPU in the same run: same weights (handed over as safetensors), same
// batch, same thread count, float32.
//
// tools/bench/step_bench.py runs PyTorch's side (torch.set_num_threads(threads))
// as a child process that takes one step per request; the two sides' steps
// alternate (after a 100 ms pause each, so neither side's idle threads are
// still spinning), so both see the same machine even when it is shared and
// its load changes. Each side takes `warmup` untimed steps, then the median
// over `steps` timed steps of each part and of the whole step. Prints a table and ends with one JSON line:
//   {"bench": "step", "model", "config", "ours_s", "reference": "pytorch X.Y (CPU, N threads)",
//    "reference_s", "speedup": reference_s / ours_s,
//    "forward": {"ours_s", "reference_s", "speedup"}, "backward": {...}, "optimizer": {...},
//    "cpu": {...} (process CPU seconds per step, all threads: robust to other load at 1 thread;
//    at more threads PyTorch's OpenMP workers spin while waiting, which counts),
//    "tokens_per_s", "reference_tokens_per_s", "batch", "seq", "threads", "steps", "first_loss": {...},
//    "memory": {"ours_allocator_peak_mib", "ours_rss_peak_mib", "reference_rss_peak_mib"} (peaks of the
//    timed steps), with torch_compile: "compiled_reference": {"name", "reference_s", "speedup", "forward",
//    "backward", "optimizer", "first_step_s", "first_loss"} or {"name", "error"},
//    with profile_steps: "profile": {"steps", "forward"/"backward"/"optimizer": [{"category", "ours_s",
//    "reference_s"}, ...]} (self seconds per step)}
#include <cstdint>
#include <iosfwd>
#include <string>

namespace tessel::tools {

struct StepBenchOptions {
  std::string model = "nanogpt";
  std::string config = "small";
  int64_t batch = 8;
  int64_t seq = 0;      // 0: the config's context length
  int warmup = 1;
  int steps = 5;
  int threads = 0;      // 0: TESSEL_THREADS, else all cores
  uint64_t seed = 1;
  bool reference = true;  // false: time tessel only
  // After the timed steps, this many more steps of each side (alternating)
  // under their profilers, reported op by op in categories: where the two
  // sides' times differ (`--profile`). Not part of the timed medians.
  int profile_steps = 0;
  // A second reference: PyTorch under torch.compile (inductor, CPU) in its
  // own process, its steps alternating with the other two sides'. Where
  // compiling fails the bench says why and goes on without it.
  bool torch_compile = false;
  std::string python;     // "" : reference_python()
};

// Returns 0, or 1 when the reference could not run or the two first-step
// losses disagree (the sides would not be computing the same thing).
int run_step_bench(const StepBenchOptions& opts, std::ostream& out);

}  // namespace tessel::tools
