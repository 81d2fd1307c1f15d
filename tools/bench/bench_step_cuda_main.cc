// bench_step_cuda: see tools/bench/step_cuda_bench.h.
#include <CLI/CLI.hpp>
#include <iostream>

#include "runtime/error.h"
#include "tools/bench/step_cuda_bench.h"

int main(int argc, char** argv) {
  tessel::tools::StepCudaBenchOptions o;
  CLI::App app{"tessel training step on a GPU: tokens/s and MFU (vs PyTorch when available)"};
  app.add_option("--model", o.model, "nanogpt | llama | mixtral");
  app.add_option("--config", o.config, "named config (gpt2-124m, tiny, ...)");
  app.add_option("--batch", o.batch, "sequences per step");
  app.add_option("--seq", o.seq, "tokens per sequence");
  app.add_option("--steps", o.steps, "timed steps (median reported)");
  app.add_option("--warmup", o.warmup, "untimed steps first");
  app.add_option("--dtype", o.dtype, "bf16 (autocast) | fp32");
  app.add_option("--gemm", o.gemm, "fast (cuBLASLt) | bitwise (canonical order, the CPU's bits)");
  app.add_option("--peak-tflops", o.peak_tflops, "peak of the GPU for MFU (default: H100 SXM dense)");
  app.add_flag("!--no-reference", o.reference, "skip the PyTorch reference");
  app.add_flag("!--no-bitwise-cost", o.bitwise_cost, "with --gemm fast: do not also time the bitwise GEMM");
  app.add_flag("!--no-compile", o.compile, "do not also time tessel::Run eager against compile mode");
  app.add_flag("--profile", o.profile, "per-op profile of the timed steps (with CUDA_LAUNCH_BLOCKING=1: GPU time per op)");
  app.add_option("--python", o.python, "interpreter for the PyTorch reference");
  app.add_option("--torch-script", o.torch_script, "path of step_cuda_torch.py");
  std::string device = "cuda";
  app.add_option("--device", device, "cuda (the only device this bench runs on)");
  CLI11_PARSE(app, argc, argv);
  try {
    if (device != "cuda" && device != "cuda:0") {
      std::cerr << "bench step_cuda: --device must be cuda\n";
      return 1;
    }
    return tessel::tools::run_step_cuda_bench(o, std::cout);
  } catch (const tessel::Error& e) {
    std::cerr << e.what() << "\n";
    return 1;
  }
}
