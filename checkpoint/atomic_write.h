#pragma once
// Atomic file writes for checkpoints: the bytes go to "<path>.tmp", which is
// flushed, fsync'ed and renamed over <path>; the directory is fsync'ed after
// the rename. A failure removes the temporary, so a reader sees either the
// previous complete file or the new complete file, never a torn one.
// (train/atomic_file.h has the same contract for run outputs; checkpoint/
// cannot depend on train/, which sits above it.)
#include <string>
#include <string_view>
#include <vector>

namespace tessel::checkpoint {

// Writes the concatenation of `parts` to `path` atomically. The parent
// directory must exist. Errors (tessel::Error) name `op` and the path.
void write_file_atomic(const std::string& path, const std::vector<std::string_view>& parts,
                       const char* op = "atomic write");

// The whole file; errors name `op` and the path.
std::string read_whole_file(const std::string& path, const char* op = "read");

}  // namespace tessel::checkpoint
