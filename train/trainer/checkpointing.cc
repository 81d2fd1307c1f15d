#include "train/trainer/checkpointing.h"

#include <filesystem>
#include <sstream>

#include "checkpoint/model_config.h"
#include "train/atomic_file.h"
#include "train/data.h"
#include "train/metrics.h"

namespace tessel::train {

nlohmann::json checkpoint_state(const TrainConfig& cfg, const models::ModelConfig& model, int64_t steps_done) {
  nlohmann::json state;
  state["loader"] = nlohmann::json::parse(LoaderState{cfg.seed, steps_done}.to_json());
  state["model"] = checkpoint::model_config_to_json(model);
  state["config"] = nlohmann::json::parse(cfg.to_json());
  return state;
}

void check_resumed(const nlohmann::json& state, const TrainConfig& cfg, const models::ModelConfig& model,
                   const std::string& root, int64_t steps_done) {
  constexpr const char* kOp = "checkpoint";
  TESSEL_CHECK(state.contains("model") && state.contains("loader"), kOp,
               "the checkpoint under '{}' (step {}) is not a `tessel train` checkpoint: it has no model config or "
               "loader position",
               root, steps_done);
  const models::ModelConfig saved = checkpoint::model_config_from_json(state["model"]);
  if (checkpoint::model_config_to_json(saved) != checkpoint::model_config_to_json(model)) {
    // How the checkpointed run chose its model, so the resume can say it again.
    std::string how;
    if (state.contains("config") && state["config"].is_object()) {
      const nlohmann::json& was = state["config"];
      const std::string init = was.value("init_from", std::string());
      how = !init.empty() ? fmt::format(FMT_STRING("; the run started with --init-from {}: pass it again"), init)
                          : fmt::format(FMT_STRING("; the run started with --model {} --config {} (and its shape "
                                                   "flags): pass them again"),
                                        was.value("model", std::string("?")), was.value("model_config", std::string("?")));
    }
    TESSEL_FAIL(kOp, "the checkpoint under '{}' (step {}) holds a {} model ({}) but this run builds {}{}", root,
                steps_done, models::arch_name(saved.arch), saved.describe(), model.describe(), how);
  }
  const LoaderState loader = LoaderState::from_json(state["loader"].dump());
  TESSEL_CHECK(loader.seed == cfg.seed && loader.step == steps_done, kOp,
               "the checkpoint under '{}': loader state {} does not match step {}", root, state["loader"].dump(),
               steps_done);
}

void truncate_metrics(const std::string& path, int64_t step) {
  if (!std::filesystem::exists(path)) return;
  std::istringstream in(read_file(path, "resume"));
  std::string kept, line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    try {
      if (StepMetrics::from_json_line(line).step <= step) kept += line + "\n";
    } catch (const Error&) {
      // a torn last line of a killed run
    }
  }
  write_file_atomic(path, kept);
}

}  // namespace tessel::train
