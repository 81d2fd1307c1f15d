#pragma once
// Saving a distributed checkpoint (docs/design.md §5; docs/checkpoint.md).
//
//   checkpoint::save("run/checkpoints/step-00000100", tensors, state);   // every rank calls it
//
// `tensors` are named global tensors: plain (the same on every rank) or
// distributed with any mesh and placements (Partial is reduced first). Each
// rank reports the boxes it holds; every rank computes the same plan
// (checkpoint/plan.h): replicas deduplicated, chunks spread over their
// holders. Each writing rank writes one safetensors file with its chunks; rank
// 0 then writes metadata.json and renames the directory into place:
//
//   <dir>.tmp/               created by rank 0, filled by every writer
//     data-00000.safetensors   rank 0's chunks; data-00000.json its checksums (removed at commit)
//     ...
//     metadata.json          written last, atomically
//   <dir>                    the rename of <dir>.tmp: the commit point
//
// Every file is fsync'ed before the rename, the parent directory after it: a
// crash at any moment leaves the previous checkpoint directories untouched
// and at most a <dir>.tmp that readers ignore (and the next save removes).
//
// Async: Saver::save(..., async = true) returns once this rank's pieces are
// copied to a staging buffer (reused across saves); a writer thread writes
// them and, on rank 0, commits. Training may change the tensors meanwhile.
// The collective part (the plan's all-gather, reducing Partial tensors) runs
// on the calling thread; writer threads never communicate (rank 0 learns
// that the other writers are done from their checksum files).
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"

namespace tessel::checkpoint {

struct SaveOptions {
  uint64_t block_bytes = 1 << 20;  // CRC granularity (a power of two >= 4096)
  // How long rank 0 waits for the other writers' files (0: the collectives' timeout).
  std::chrono::milliseconds commit_timeout{0};
  // Rank 0, on the writer thread, after the commit (e.g. pruning old checkpoints).
  std::function<void(const std::string& dir)> after_commit;
  // Tests: called on each writer thread at "writing" (the first block of this
  // rank's data file is written), "data" (this rank's data file is
  // written, not yet its checksums), "manifest", and on rank 0 "metadata"
  // (metadata.json written, directory not yet renamed) and "committed".
  std::function<void(const std::string& stage)> on_stage;
};

class Saver {
 public:
  Saver();
  ~Saver();  // waits for a pending write; its error is logged, not thrown
  Saver(const Saver&) = delete;
  Saver& operator=(const Saver&) = delete;

  // Collective over the world (every rank, same dir, the tensors in any
  // order). A rank may leave out tensors it holds nothing of (a pipeline
  // stage's Meta parameters); every box of a tensor must be held somewhere. Waits for this rank's previous save first. Sync: returns
  // when the checkpoint is committed (on every rank). Async: returns when the
  // pieces are staged.
  void save(const std::string& dir, const NamedTensors& tensors, const nlohmann::json& state, bool async,
            const SaveOptions& options = {});
  // Waits for this rank's pending write (on rank 0: and the commit);
  // rethrows its error.
  void wait();
  bool busy() const { return thread_.joinable(); }

 private:
  struct Job;
  std::thread thread_;
  std::exception_ptr error_;
  std::unique_ptr<char[]> staging_;
  size_t staging_bytes_ = 0;
};

// Saver().save(dir, tensors, state, /*async=*/false, options).
void save(const std::string& dir, const NamedTensors& tensors, const nlohmann::json& state = nlohmann::json::object(),
          const SaveOptions& options = {});

}  // namespace tessel::checkpoint
