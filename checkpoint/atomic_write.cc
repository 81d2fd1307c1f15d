#include "checkpoint/atomic_write.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "runtime/error.h"

namespace tessel::checkpoint {

namespace {

// Writes all of `bytes` to fd, retrying short writes and EINTR.
bool write_all(int fd, std::string_view bytes) {
  const char* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    ssize_t n = ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    left -= size_t(n);
  }
  return true;
}

void fsync_parent(const std::string& path) {
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);  // best effort: some file systems refuse fsync on directories
    ::close(fd);
  }
}

}  // namespace

void write_file_atomic(const std::string& path, const std::vector<std::string_view>& parts, const char* op) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  TESSEL_CHECK(fd >= 0, op, "cannot create '{}': {}", tmp, std::strerror(errno));
  bool ok = true;
  int err = 0;
  for (std::string_view part : parts) {
    if (!write_all(fd, part)) {
      ok = false;
      err = errno;
      break;
    }
  }
  if (ok && ::fsync(fd) != 0) {
    ok = false;
    err = errno;
  }
  if (::close(fd) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    std::remove(tmp.c_str());
    TESSEL_FAIL(op, "writing '{}' failed: {}", tmp, std::strerror(err));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    std::remove(tmp.c_str());
    TESSEL_FAIL(op, "renaming '{}' to '{}' failed: {}", tmp, path, std::strerror(err));
  }
  fsync_parent(path);
}

std::string read_whole_file(const std::string& path, const char* op) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  TESSEL_CHECK(fd >= 0, op, "cannot open '{}': {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    TESSEL_FAIL(op, "cannot read '{}': not a regular file", path);
  }
  std::string out(size_t(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : 0;
      ::close(fd);
      TESSEL_FAIL(op, "reading '{}' failed after {} of {} bytes: {}", path, got, out.size(),
                  err ? std::strerror(err) : "unexpected end of file");
    }
    got += size_t(n);
  }
  ::close(fd);
  return out;
}

}  // namespace tessel::checkpoint
