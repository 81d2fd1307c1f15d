#pragma once
// POSIX file helpers for checkpoints: whole writes and reads at offsets that
// retry short transfers and EINTR, directory fsync, atomic directory swaps.
// Errors are tessel::Error naming the operation, the path and errno's text.
#include <cstddef>
#include <cstdint>
#include <string>

namespace tessel::checkpoint::io {

// An open file descriptor, closed by the destructor.
class File {
 public:
  File() = default;
  File(const std::string& path, int flags, const char* op);  // ::open(path, flags | O_CLOEXEC, 0644)
  ~File();
  File(File&& o) noexcept : fd_(o.fd_), path_(std::move(o.path_)) { o.fd_ = -1; }
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  uint64_t size(const char* op) const;
  void write_all(const void* data, size_t n, const char* op);
  // Reads exactly n bytes at `offset`; fewer (end of file) is an error naming `what`.
  void pread_all(void* data, size_t n, uint64_t offset, const char* op, const std::string& what) const;
  void fsync(const char* op);
  void close(const char* op);  // reports errors of close (delayed write failures)

 private:
  int fd_ = -1;
  std::string path_;
};

bool exists(const std::string& path);
bool is_dir(const std::string& path);
// fsync on a directory makes renames and creations in it durable (best effort:
// some file systems refuse it).
void fsync_dir(const std::string& dir);
void make_dir(const std::string& dir, const char* op);  // mkdir -p
// Removes a file or a directory tree; missing is fine.
void remove_tree(const std::string& path);
// Makes `from` appear at `to` atomically. When `to` exists (a directory), the
// two are exchanged (renameat2 RENAME_EXCHANGE) and the old one, now at
// `from`, is removed: a reader sees the old or the new, never neither.
void replace_dir(const std::string& from, const std::string& to, const char* op);
// Writes `bytes` to path atomically (path.tmp, fsync, rename, fsync dir).
void write_file_atomic(const std::string& path, const std::string& bytes, const char* op);
std::string read_file(const std::string& path, const char* op);

}  // namespace tessel::checkpoint::io
