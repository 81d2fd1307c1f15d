// `tessel bench generate`: greedy generation against transformers (tools/bench/generate_bench.h).
#include <iostream>

#include "tools/bench/generate_bench.h"
#include "tools/cli/commands.h"

namespace tessel::cli {

void register_bench_generate(CLI::App& app) {
  static tools::GenerateBenchOptions o;
  static bool no_reference = false;
  CLI::App* cmd = add_command(*bench_command(app), "generate",
                              "greedy generation of a batch of prompts (KV cache) against transformers' generate "
                              "on the CPU; ends with one JSON line",
                              [] {
                                o.reference = !no_reference;
                                return tools::run_generate_bench(o, std::cout);
                              });
  cmd->add_option("--model", o.model, "nanogpt | llama | mixtral")->capture_default_str();
  cmd->add_option("--config", o.config, "named model config")->capture_default_str();
  cmd->add_option("--batch", o.batch, "prompts generated together")->capture_default_str();
  cmd->add_option("--prompt-len", o.prompt_len, "tokens per prompt")->capture_default_str();
  cmd->add_option("--new-tokens", o.new_tokens, "tokens generated per prompt")->capture_default_str();
  cmd->add_option("--rounds", o.rounds, "timed rounds per side, interleaved (medians reported)")->capture_default_str();
  cmd->add_option("--threads", o.threads, "threads for both (0: TESSEL_THREADS, else all cores)")->capture_default_str();
  cmd->add_option("--python", o.python, "Python with torch and transformers (default: ~/.cache/tessel/venv)");
  cmd->add_flag("--no-reference", no_reference, "time tessel only");
  cmd->add_flag("--profile", o.profile, "print tessel's per-op self times over the timed rounds");
}

}  // namespace tessel::cli
