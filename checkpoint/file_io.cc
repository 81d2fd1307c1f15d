#include "checkpoint/file_io.h"

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/error.h"

namespace tessel::checkpoint::io {

namespace fs = std::filesystem;

File::File(const std::string& path, int flags, const char* op) : path_(path) {
  do {
    fd_ = ::open(path.c_str(), flags | O_CLOEXEC, 0644);
  } while (fd_ < 0 && errno == EINTR);
  TESSEL_CHECK(fd_ >= 0, op, "cannot open '{}': {}", path, std::strerror(errno));
}

File::~File() {
  if (fd_ >= 0) ::close(fd_);
}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    path_ = std::move(o.path_);
    o.fd_ = -1;
  }
  return *this;
}

uint64_t File::size(const char* op) const {
  struct stat st {};
  TESSEL_CHECK(::fstat(fd_, &st) == 0, op, "cannot stat '{}': {}", path_, std::strerror(errno));
  return uint64_t(st.st_size);
}

void File::write_all(const void* data, size_t n, const char* op) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd_, p, n);
    if (w < 0 && errno == EINTR) continue;
    TESSEL_CHECK(w > 0, op, "writing '{}' failed: {}", path_, w < 0 ? std::strerror(errno) : "no progress");
    p += w;
    n -= size_t(w);
  }
}

void File::pread_all(void* data, size_t n, uint64_t offset, const char* op, const std::string& what) const {
  char* p = static_cast<char*>(data);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd_, p + got, n - got, off_t(offset + got));
    if (r < 0 && errno == EINTR) continue;
    TESSEL_CHECK(r >= 0, op, "reading '{}' ({}) failed: {}", path_, what, std::strerror(errno));
    TESSEL_CHECK(r > 0, op, "'{}' ends at byte {}, before the end of {} at {}: the file is truncated", path_,
                 offset + got, what, offset + n);
    got += size_t(r);
  }
}

void File::fsync(const char* op) {
  TESSEL_CHECK(::fsync(fd_) == 0, op, "fsync of '{}' failed: {}", path_, std::strerror(errno));
}

void File::close(const char* op) {
  if (fd_ < 0) return;
  const int rc = ::close(fd_);
  fd_ = -1;
  TESSEL_CHECK(rc == 0 || errno == EINTR, op, "closing '{}' failed: {}", path_, std::strerror(errno));
}

bool exists(const std::string& path) {
  struct stat st {};
  return ::lstat(path.c_str(), &st) == 0;
}

bool is_dir(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

void fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
}

void make_dir(const std::string& dir, const char* op) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  TESSEL_CHECK(!ec || is_dir(dir), op, "cannot create the directory '{}': {}", dir, ec.message());
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

void replace_dir(const std::string& from, const std::string& to, const char* op) {
  if (::rename(from.c_str(), to.c_str()) != 0) {
    TESSEL_CHECK(errno == ENOTEMPTY || errno == EEXIST, op, "renaming '{}' to '{}' failed: {}", from, to,
                 std::strerror(errno));
    TESSEL_CHECK(::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0, op,
                 "exchanging '{}' with the existing '{}' failed: {}", from, to, std::strerror(errno));
    fsync_dir(fs::path(to).parent_path().string());
    remove_tree(from);  // the old one
  }
  fsync_dir(fs::path(to).parent_path().string());
}

void write_file_atomic(const std::string& path, const std::string& bytes, const char* op) {
  const std::string tmp = path + ".tmp";
  {
    File f(tmp, O_WRONLY | O_CREAT | O_TRUNC, op);
    f.write_all(bytes.data(), bytes.size(), op);
    f.fsync(op);
    f.close(op);
  }
  TESSEL_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, op, "renaming '{}' to '{}' failed: {}", tmp, path,
               std::strerror(errno));
  fsync_dir(fs::path(path).parent_path().string());
}

std::string read_file(const std::string& path, const char* op) {
  File f(path, O_RDONLY, op);
  std::string out(size_t(f.size(op)), '\0');
  f.pread_all(out.data(), out.size(), 0, op, "the whole file");
  return out;
}

}  // namespace tessel::checkpoint::io
