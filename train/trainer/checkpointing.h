#pragma once
// What the trainer adds to the training API's checkpoints (run/checkpoint.h,
// docs/checkpoint.md): tessel::Checkpoints saves the model, the optimizer and
// the step every cfg.ckpt_every steps into cfg.checkpoint_root()/step-N; the
// trainer's keys ride along in the checkpoint's state:
//
//   "loader": LoaderState {seed, step}   the data position (train/data.h)
//   "model":  ModelConfig                 what a resume must rebuild
//   "config": TrainConfig                 the whole run's settings, for the record
//
// The RNG needs nothing more than (seed, step): every Philox key derives
// from them and the call site (docs/design.md §4), so dropout masks, data order
// and sampling after a resume are those of an uninterrupted run.
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "models/config.h"
#include "train/config.h"

namespace tessel::train {

// The trainer's keys for a checkpoint after `steps_done` steps.
nlohmann::json checkpoint_state(const TrainConfig& cfg, const models::ModelConfig& model, int64_t steps_done);

// Checks the keys a resumed checkpoint (under `root`, `steps_done` steps)
// brought back: the same model config and a loader position that matches.
void check_resumed(const nlohmann::json& state, const TrainConfig& cfg, const models::ModelConfig& model,
                   const std::string& root, int64_t steps_done);

// Keeps the records of steps <= `step` in a metrics file (a resumed run
// continues it from there); drops later ones and any torn last line.
void truncate_metrics(const std::string& path, int64_t step);

}  // namespace tessel::train
