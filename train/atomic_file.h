#pragma once
// Files that are never seen half-written.
//
// Everything a run writes into its output directory goes through
// AtomicFile (or write_file_atomic): the bytes go to "<path>.tmp", which is
// flushed, fsync'ed and renamed over <path> by commit(). An AtomicFile
// destroyed without commit() (an exception, an early return) removes its
// temporary, so a failed run leaves either the previous complete file or
// nothing. The output directory itself is created only by
// OutputDir::create(), which a trainer calls after the configuration has
// been validated: a run that fails validation creates nothing.
#include <cstdio>
#include <string>
#include <string_view>

namespace tessel::train {

// The whole file. Throws tessel::Error("<op>: cannot read '<path>': <reason>").
std::string read_file(const std::string& path, const char* op = "read_file");

// Writes `content` to path atomically (temporary, fsync, rename). The parent
// directory must exist.
void write_file_atomic(const std::string& path, std::string_view content);

class AtomicFile {
 public:
  // Opens "<path>.tmp" for writing (truncating); the parent directory must exist.
  explicit AtomicFile(std::string path);
  ~AtomicFile();  // removes the temporary unless committed
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(std::string_view bytes);
  // Flush, fsync, rename "<path>.tmp" -> path, fsync the directory.
  void commit();
  const std::string& path() const { return path_; }
  std::string temp_path() const { return path_ + ".tmp"; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
  bool committed_ = false;
};

// A run's output directory. Constructing one touches nothing on disk.
class OutputDir {
 public:
  explicit OutputDir(std::string dir) : dir_(std::move(dir)) {}
  // Creates the directory (and parents). Idempotent.
  void create() const;
  bool exists() const;
  const std::string& dir() const { return dir_; }
  // dir/name
  std::string path(const std::string& name) const;
  // create(), then write_file_atomic(path(name), content).
  void write(const std::string& name, std::string_view content) const;
  // Removes leftover "*.tmp" files (from a crashed earlier run); returns how many.
  int remove_temporaries() const;

 private:
  std::string dir_;
};

}  // namespace tessel::train
