#pragma once
// bench step_cuda: one training step (forward, backward, gradient clipping,
// AdamW) of a model on a GPU, timed with device synchronisation, in tokens/s
// and model FLOPs utilisation; optionally against PyTorch eager and
// torch.compile on the same GPU in the same run (tools/bench/step_cuda_torch.py,
// when `python3 -c "import torch"` works there).
//
// Ends with one JSON line:
//   {"bench": "step_cuda", "ours_s": median step s, "reference": "pytorch eager ...",
//    "reference_s": eager step s | null, "speedup": reference_s / ours_s | null,
//    "model": .., "config": .., "batch": .., "seq": .., "dtype": "bf16"|"fp32",
//    "gemm": "fast"|"bitwise", "params": .., "step_ms": .., "tokens_per_s": ..,
//    "mfu": .., "peak_tflops": .., "peak_memory_bytes": ..,
//    "bitwise": {"step_ms", "cost": bitwise / fast, "loss"} | null,
//    "compile": {"eager_ms", "compiled_ms", "speedup", "compiled_without_graphs_ms",
//                "graphs": {"graphs", "graph_launches", "captures", "refused", "last_refusal",
//                           "speedup_over_host_launches"},
//                "parts_ms": {"eager"|"compiled"|"compiled_without_graphs":
//                             {"forward_backward", "step_optimizer"}}, "same_bits",
//                "differs" (which side left eager's bits, from which step; "" if none),
//                "replays", "module_calls_replayed" (mixed mode: a model with MoE layers),
//                "kernels_per_step", "fused_chains", "fused_launches" (elementwise chains,
//                each one kernel), "step_memory_mib": {..}, "refused"} | null,
//    "torch": {"eager": {..}, "compile": {..}} | null}
// "compile" (skip with --no-compile): the same steps through tessel::Run,
// eager and in compile mode (RunOptions::compile, docs/compile.md) with CUDA
// graphs and without them, one step of each in turn, in the same process:
// what replaying the recorded kernels saves of the host's per-op work, what
// launching them as graphs saves on top, and whether the replays keep the
// bits.
// MFU counts nanoGPT's 6 N + 12 L H Q T FLOPs per token against
// --peak-tflops (default: the H100 SXM dense peak of the compute dtype).
#include <iosfwd>
#include <string>

namespace tessel::tools {

struct StepCudaBenchOptions {
  std::string model = "nanogpt";
  std::string config = "gpt2-124m";
  int64_t batch = 8;
  int64_t seq = 1024;
  int steps = 20;
  int warmup = 3;
  std::string dtype = "bf16";  // bf16 (autocast, float32 master weights) | fp32
  std::string gemm = "fast";   // fast (cuBLASLt) | bitwise
  double peak_tflops = 0;      // 0: H100 SXM dense peak for the dtype
  bool bitwise_cost = true;    // with gemm fast: also time the bitwise GEMM (its cost)
  bool compile = true;         // also time tessel::Run eager against compile mode (same GEMM mode)
  bool reference = true;       // run the PyTorch reference when available
  bool profile = false;        // print the per-op profile of the timed steps
  std::string python = "python3";
  std::string torch_script;    // default: next to the sources / the binary
};

// Returns 0 on success, 2 when no GPU is available (after printing why).
int run_step_cuda_bench(const StepCudaBenchOptions& opts, std::ostream& out);

}  // namespace tessel::tools
