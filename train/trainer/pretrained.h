#pragma once
// Weights from elsewhere: what `tessel train --init-from DIR` (fine-tuning)
// and `tessel generate --from DIR` start from.
//
// DIR is one of
//   - a Hugging Face model folder: config.json and model.safetensors, or
//     model.safetensors.index.json and its shards (checkpoint/hf.h names);
//   - a tessel checkpoint: a step folder with metadata.json, whose state
//     records the model config (`tessel train --ckpt-every N` writes it);
//   - a checkpoints folder or a run folder (DIR/checkpoints): its newest
//     complete checkpoint.
// The model config comes from the folder (config.json, or the checkpoint's
// state), never from flags.
//
// Loading fills the weights of a parallelized Run in place, on any mesh;
// not collective (each rank reads what it holds): from a tessel checkpoint
// the byte ranges of its pieces (checkpoint/load.h), from a Hugging Face
// folder the headers and then its pieces' rows (checkpoint/hf_reader.h), so
// no rank materialises a model larger than its share. Every parameter must
// be found with its shape, and a tensor the model does not have is an error:
// both name the tensor.
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "models/language_model.h"
#include "run/run.h"

namespace tessel::train {

struct Pretrained {
  enum class Kind { HuggingFace, Checkpoint };
  Kind kind = Kind::HuggingFace;
  std::string path;          // the folder read: the HF folder, or the checkpoint's step folder
  models::ModelConfig model;  // resolved
  // A tessel checkpoint's training config (its "config" key: tokenizer and
  // data settings), when it has one.
  std::optional<nlohmann::json> train_config;
  // A Hugging Face folder's config.json eos_token_id (an id, or a list's first).
  std::optional<int64_t> eos_id;
  const char* kind_name() const { return kind == Kind::HuggingFace ? "Hugging Face folder" : "tessel checkpoint"; }
};

// Finds what DIR holds (above); errors say what was looked for.
Pretrained find_pretrained(const std::string& dir);

struct WeightsLoaded {
  size_t tensors = 0;       // tensors this rank filled
  uint64_t bytes_read = 0;  // bytes this rank read from files
};

// Fills run's model weights (not the optimizer, step or RNG) from `p`.
WeightsLoaded load_pretrained_weights(const Pretrained& p, Run<models::LanguageModel>& run);

}  // namespace tessel::train
