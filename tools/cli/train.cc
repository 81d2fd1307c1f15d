// `tessel train`: train NanoGPT / LLaMA / Mixtral on a text corpus (default:
// the Debian fortunes package). Settings: TrainConfig (train/config.h), from
// defaults < --config-file FILE.toml < flags.
#include "train/config.h"
#include "train/trainer/trainer.h"
#include "tools/cli/commands.h"

namespace tessel::cli {

void register_train(CLI::App& app) {
  // The demo's settings unless flags or a config file say otherwise.
  static train::TrainConfig cfg = train::TrainConfig::cli_defaults();
  CLI::App* cmd = add_command(app, "train", "Train a model (nanogpt | llama | mixtral) on a text corpus", [] {
    train::run_training(cfg);
    return 0;
  });
  train::add_train_options(*cmd, cfg);
  cmd->add_flag_function(
      "--no-final-ckpt", [](int64_t n) { cfg.final_ckpt = n == 0; },
      "do not save the final model (tessel train saves <out>/checkpoints/step-N at the last step by default)");
}

}  // namespace tessel::cli
