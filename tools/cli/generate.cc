// `tessel generate`: text from a trained or imported model (train/trainer/generate.h).
#include "tools/cli/commands.h"
#include "train/trainer/generate.h"

namespace tessel::cli {

void register_generate(CLI::App& app) {
  static train::GenerateConfig cfg;
  CLI::App* cmd = add_command(app, "generate",
                              "Generate text from a Hugging Face folder, a tessel checkpoint or a run folder", [] {
                                train::run_generate(cfg);
                                return 0;
                              });
  cmd->add_option("--from", cfg.from, "the model: a Hugging Face folder, a checkpoint or a run folder")
      ->required()
      ->type_name("DIR");
  cmd->add_option("--prompt", cfg.prompts, "a text prompt (repeat for a batch)")->type_name("TEXT");
  cmd->add_option("--ids", cfg.ids, "a prompt as token ids, e.g. 1,5,9 (repeat for a batch)")->type_name("IDS");
  cmd->add_option("--max-new-tokens", cfg.max_new_tokens, "tokens to generate per prompt")->capture_default_str();
  cmd->add_option("--temperature", cfg.temperature, "0: greedy; > 0: sample")->capture_default_str();
  cmd->add_option("--top-k", cfg.top_k, "sample from the k most likely tokens (0: all)")->capture_default_str();
  cmd->add_option("--top-p", cfg.top_p, "sample from the smallest set with this probability (1: all)")
      ->capture_default_str();
  cmd->add_option("--seed", cfg.seed, "sampling seed")->capture_default_str();
  cmd->add_option("--mesh", cfg.mesh, "run on a mesh, e.g. tp=2 or pp=2 (ranks as threads, or under tessel launch)");
  cmd->add_flag("--json", cfg.json, "print one JSON line per prompt: prompt, prompt_ids, ids, text");
  cmd->add_flag("--ignore-eos", cfg.ignore_eos, "do not stop at the end-of-sequence token");
  cmd->add_flag("--no-kv-cache", [](int64_t n) { cfg.kv_cache = n == 0; },
                "re-run the whole sequence for every token (slow; for checking the cache)");
  cmd->add_option("--tokenizer-json", cfg.tokenizer_json, "a Hugging Face tokenizer.json (default: the folder's)")
      ->type_name("FILE");
}

}  // namespace tessel::cli
