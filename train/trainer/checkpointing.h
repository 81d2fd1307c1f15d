#pragma once
// The trainer's checkpoints (docs/checkpoint.md): what a resume needs, saved
// every cfg.ckpt_every steps into cfg.checkpoint_root()/step-N.
//
//   tensors  "model.<path>"  the model's state_dict (parameters, persistent buffers)
//            "optim.<key>"   the optimizer's state_dict ("step", "<path>.step",
//                            "<path>.exp_avg", ...), distributed like the parameters
//   state    {"step": steps done, "rng": {"seed", "step"}, "loader": LoaderState,
//             "model": ModelConfig, "optimizer": name, "mesh": ..., "config": TrainConfig}
//
// The RNG needs nothing more than (seed, step): every Philox key derives
// from them and the call site (DESIGN.md §4), so dropout masks, data order
// and sampling after a resume are those of an uninterrupted run. The loader's
// whole state is LoaderState{seed, step} (train/data.h).
#include <cstdint>
#include <memory>
#include <string>

#include "models/language_model.h"
#include "nn/optim.h"
#include "train/config.h"

namespace tessel::checkpoint {
class Saver;
}

namespace tessel::train {

class TrainCheckpointer {
 public:
  // Call on every rank after the model is laid out and the optimizer built.
  // Rank 0 removes what crashed saves left behind.
  TrainCheckpointer(const TrainConfig& cfg, const models::LanguageModel& model, nn::Optimizer& opt, bool main_rank);
  ~TrainCheckpointer();

  // With cfg.resume: loads the newest complete checkpoint into the model and
  // optimizer (whatever mesh it was saved on) and returns the steps it had
  // done; 0 when there is none (or without cfg.resume). Errors when the
  // checkpoint was trained with another seed or model.
  int64_t resume();
  // After `steps_done` steps: saves when due (every ckpt_every steps and at
  // cfg.steps). Collective; async unless cfg.ckpt_sync.
  void after_step(int64_t steps_done);
  // Waits for the pending save; rethrows its error.
  void finish();

  const std::string& root() const { return root_; }

 private:
  const TrainConfig& cfg_;
  const models::LanguageModel& model_;
  nn::Optimizer& opt_;
  bool main_rank_;
  std::string root_;
  std::unique_ptr<checkpoint::Saver> saver_;
};

// Keeps the records of steps <= `step` in a metrics file (a resumed run
// continues it from there); drops later ones and any torn last line.
void truncate_metrics(const std::string& path, int64_t step);

}  // namespace tessel::train
