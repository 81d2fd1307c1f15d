#pragma once
// Checkpoints of a tessel::Run (run.h): the model, the optimizer, the step
// and what the caller adds (a data loader's position, a config), saved from
// any layout and loaded into any other (docs/checkpoint.md):
//
//   tessel::save(dir, run, {{"loader", loader_json}});  // every rank; collective
//   nlohmann::json extra = tessel::load(dir, run);       // any mesh, any world size
//
// or, for a training loop that checkpoints every N steps into one folder:
//
//   tessel::Checkpoints ckpt(root, {/*every=*/100, /*keep_last=*/3});
//   ckpt.resume(run);                                  // the newest complete one, if any
//   for (...) { ...; run.step_optimizer(); ckpt.after_step(run, last_step); }
//   tessel::wait_for_save(run);
//
// Format (the trainer's, `tessel train --resume` reads either):
//   tensors  "model.<path>"  the model's state_dict (parameters, persistent buffers)
//            "optim.<key>"   the optimizer's state_dict ("step", "<path>.exp_avg", ...),
//                            laid out like the parameters
//   state    {"step", "rng": {"seed", "step"}, "optimizer", "mesh", "model_type",
//             "lr_schedule" (when set), and the caller's keys}
// The RNG needs nothing more than (seed, step): every Philox key derives
// from them and the call site, so dropout masks (and data order, for a loader
// keyed the same way) continue exactly where they stopped.
//
// load() checks everything before it writes anything: a checkpoint of
// another model (a tensor missing on either side, a shape or dtype that
// differs), of another seed, or an optimizer state for parameters this
// optimizer does not have is an error naming the tensor, and the run is left
// as it was. The optimizer's state is created on load even when it has not
// stepped yet.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "run/run.h"

namespace tessel {

// Saves `run` into `dir` (collective: every rank, same dir). `extra`: a JSON
// object of the caller's keys (not "step", "rng", "optimizer", "mesh",
// "model_type", "lr_schedule"). async: returns once this rank's pieces are
// staged (the run's next save, tessel::load and the Run's destructor wait
// for it).
void save(const std::string& dir, RunBase& run, const nlohmann::json& extra = nlohmann::json::object(),
          bool async = false);

// Before anything is loaded: the caller's keys and the step of the
// checkpoint, for checks of the caller's own (throw to refuse it).
using LoadCheck = std::function<void(const nlohmann::json& extra, int64_t step)>;

// Loads `dir` into `run` (model, optimizer, step) and returns the caller's
// keys saved with it. Not collective (each rank reads its pieces), but every
// rank should load the same checkpoint. `check`, if given, sees the keys
// first.
nlohmann::json load(const std::string& dir, RunBase& run, const LoadCheck& check = nullptr);

// Loads only the model's tensors of `dir` into `run`: not the optimizer, the
// step or the RNG (fine-tuning from another run's weights; any seed). Not
// collective; each rank reads only its pieces. The same checks as load():
// both sides must have the same model tensors, dtypes and shapes. Returns the
// bytes this rank read.
uint64_t load_weights(const std::string& dir, RunBase& run);

// Waits for `run`'s pending async save (on rank 0: its commit); rethrows its error.
void wait_for_save(RunBase& run);

// A folder of step-N checkpoints (checkpoint/manager.h).
class Checkpoints {
 public:
  struct Options {
    int64_t every = 0;      // after_step saves every N steps (0: only when asked or at the last step)
    int64_t keep_last = 0;  // keep the newest K complete checkpoints (0: all)
    bool async = true;      // save in the background
  };
  // Removes what crashed saves left behind (rank 0).
  explicit Checkpoints(std::string root, Options options);
  explicit Checkpoints(std::string root);
  ~Checkpoints();

  // Loads the newest complete checkpoint under root into `run`; returns its
  // caller's keys, or nullopt when there is none (a fresh run).
  std::optional<nlohmann::json> resume(RunBase& run, const LoadCheck& check = nullptr);
  // After a step: saves root/step-N when N is a multiple of `every` or
  // `last` is set. Returns whether it saved.
  bool after_step(RunBase& run, bool last, const nlohmann::json& extra = nlohmann::json::object());
  // Saves root/step-<run.step()> now (then prunes to keep_last).
  void save(RunBase& run, const nlohmann::json& extra = nlohmann::json::object());

  const std::string& root() const { return root_; }

 private:
  std::string root_;
  Options options_;
};

}  // namespace tessel
