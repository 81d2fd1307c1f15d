#pragma once
// models::ModelConfig as JSON: stored in a training checkpoint's state (so
// `tessel ckpt convert` can write a Hugging Face config.json from it).
#include <nlohmann/json.hpp>

#include "models/config.h"

namespace tessel::checkpoint {

nlohmann::json model_config_to_json(const models::ModelConfig& c);
// Every field must be present with the right type; errors name the field.
models::ModelConfig model_config_from_json(const nlohmann::json& j);

}  // namespace tessel::checkpoint
