#pragma once
// What tessel hands to its PyTorch reference (test/conformance/reference.py,
// tools/bench/step_bench.py): a folder with
//   weights.safetensors  the model's parameters by tessel path
//   batch.safetensors    ids, targets (int64 [B, T])
//   meta.json            model config, batch shape, AdamW hyper-parameters and
//                        param groups (paths), plus any extra fields
// and the Python interpreter that runs it.
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/language_model.h"
#include "nn/optim.h"

namespace tessel::tools {

// Every field of the resolved config that the reference builds the model from.
nlohmann::json model_config_json(const models::ModelConfig& c);

// {"lr", "betas", "eps", "weight_decay"} and the groups as {"name", "weight_decay", "params": [paths]}.
nlohmann::json adamw_json(const nn::AdamWOptions& o);
nlohmann::json param_groups_json(const std::vector<nn::ParamGroup>& groups, double default_weight_decay);

// Writes weights.safetensors, batch.safetensors and meta.json (meta plus
// "config", "batch", "seq", "params") into `dir` (created if missing).
void write_reference_inputs(const std::string& dir, const models::LanguageModel& model, const Tensor& ids,
                            const Tensor& targets, nlohmann::json meta);

// The interpreter with torch: $TESSEL_PYTHON, else ~/.cache/tessel/venv/bin/python
// (made by tools/python_venv.sh); "" when neither exists.
std::string reference_python();
// The repository root (for the Python scripts): $TESSEL_ROOT, else
// $BUILD_WORKSPACE_DIRECTORY (bazel run), else the current directory.
std::string repository_root();

}  // namespace tessel::tools
