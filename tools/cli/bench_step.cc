// `tessel bench step`: a training step against PyTorch (tools/bench/step_bench.h).
#include <iostream>

#include "tools/bench/step_bench.h"
#include "tools/cli/commands.h"

namespace tessel::cli {

void register_bench_step(CLI::App& app) {
  static tools::StepBenchOptions o;
  static bool no_reference = false;
  CLI::App* cmd = add_command(*bench_command(app), "step",
                              "Time a training step (forward, backward, AdamW) against PyTorch on the CPU", [] {
                                o.reference = !no_reference;
                                return tools::run_step_bench(o, std::cout);
                              });
  cmd->add_option("--model", o.model, "nanogpt | llama | mixtral")->capture_default_str();
  cmd->add_option("--config", o.config, "named model config")->capture_default_str();
  cmd->add_option("--batch", o.batch, "sequences per step")->capture_default_str();
  cmd->add_option("--seq", o.seq, "tokens per sequence (0: the config's context)")->capture_default_str();
  cmd->add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  cmd->add_option("--steps", o.steps, "timed steps (medians reported)")->capture_default_str();
  cmd->add_option("--threads", o.threads, "threads for both (0: TESSEL_THREADS, else all cores)")->capture_default_str();
  cmd->add_option("--python", o.python, "Python with torch (default: $TESSEL_PYTHON, ~/.cache/tessel/venv)");
  cmd->add_flag("--no-reference", no_reference, "time tessel only");
}

}  // namespace tessel::cli
