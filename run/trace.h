#pragma once
// Writing a run's timeline (RunOptions::trace, docs/trace.md): internal to run/.
#include <string>

#include "runtime/device.h"
#include "runtime/timeline.h"

namespace tessel::detail {

// `path` with ".rank<r>" before its extension: trace.json -> trace.rank1.json.
std::string trace_rank_path(const std::string& path, int rank);

// Creates the folder and this rank's (empty) file: a path that cannot be
// written fails when the Run starts, not after its steps.
void prepare_trace_file(const std::string& path, int rank, int ranks);

// Writes this rank's events to trace_rank_path(path, rank) (alone in the
// world: to `path`). With `merge` (collective over the world communicator,
// its tensors on `device`), rank 0 also gathers every rank's events and
// writes them to `path`, one track per rank. `meta`: top-level JSON members
// for the files. Returns `path` on the rank that wrote it, else "".
std::string write_trace_files(const timeline::Recorder& r, const std::string& path, bool merge, Device device,
                              const std::string& meta);

}  // namespace tessel::detail
