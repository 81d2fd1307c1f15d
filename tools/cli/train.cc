// `tessel train`: train NanoGPT / LLaMA / Mixtral on a text corpus (default:
// the Debian fortunes package). Settings: TrainConfig (train/config.h), from
// defaults < --config-file FILE.toml < flags.
#include "train/config.h"
#include "train/trainer/trainer.h"
#include "tools/cli/commands.h"

namespace tessel::cli {

void register_train(CLI::App& app) {
  static train::TrainConfig cfg;
  CLI::App* cmd = add_command(app, "train", "Train a model (nanogpt | llama | mixtral) on a text corpus", [] {
    train::run_training(cfg);
    return 0;
  });
  train::add_train_options(*cmd, cfg);
}

}  // namespace tessel::cli
