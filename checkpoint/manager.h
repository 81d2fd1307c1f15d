#pragma once
// A directory of checkpoints, one per step, as a training run keeps them:
//
//   <root>/step-00000100/        complete (renamed into place after metadata.json)
//   <root>/step-00000200.tmp/    being written, or left by a crash: ignored
//
// latest() is the newest complete one; prune() keeps the newest K. Removal
// renames a directory to "<name>.deleting" before deleting it, so a crash
// during removal never leaves a half-deleted directory under a complete name.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tessel::checkpoint {

struct CheckpointEntry {
  int64_t step = 0;
  std::string path;
};

// "<root>/step-00000100"
std::string step_dir(const std::string& root, int64_t step);
// Complete checkpoints (a step-N directory holding metadata.json), by step.
std::vector<CheckpointEntry> list_checkpoints(const std::string& root);
std::optional<CheckpointEntry> latest_checkpoint(const std::string& root);
// Removes all but the newest `keep_last` complete checkpoints (0: keep all),
// and leftovers of crashed saves and removals (*.tmp, *.deleting) except
// `in_progress` (a directory name being written, if any). Returns how many
// directories were removed.
int prune_checkpoints(const std::string& root, int64_t keep_last, const std::string& in_progress = "");

}  // namespace tessel::checkpoint
