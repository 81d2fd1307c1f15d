#include "train/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "runtime/error.h"

namespace tessel::train {

namespace fs = std::filesystem;

std::string read_file(const std::string& path, const char* op) {
  std::error_code ec;
  TESSEL_CHECK(fs::exists(path, ec), op, "cannot read '{}': no such file", path);
  TESSEL_CHECK(!fs::is_directory(path, ec), op, "cannot read '{}': it is a directory", path);
  std::ifstream in(path, std::ios::binary);
  TESSEL_CHECK(in.good(), op, "cannot read '{}': {}", path, std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  TESSEL_CHECK(!in.bad(), op, "cannot read '{}': read error", path);
  return ss.str();
}

namespace {
void fsync_dir(const std::string& file_path) {
  fs::path parent = fs::path(file_path).parent_path();
  if (parent.empty()) parent = ".";
  int fd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);  // best effort: some file systems refuse fsync on directories
    ::close(fd);
  }
}
}  // namespace

AtomicFile::AtomicFile(std::string path) : path_(std::move(path)) {
  file_ = std::fopen(temp_path().c_str(), "wb");
  TESSEL_CHECK(file_ != nullptr, "atomic write", "cannot create '{}': {}", temp_path(), std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (file_) std::fclose(file_);
  if (!committed_) std::remove(temp_path().c_str());
}

void AtomicFile::write(std::string_view bytes) {
  TESSEL_CHECK(file_ != nullptr && !committed_, "atomic write", "'{}' is already committed", path_);
  if (bytes.empty()) return;
  TESSEL_CHECK(std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size(), "atomic write",
               "writing '{}' failed: {}", temp_path(), std::strerror(errno));
}

void AtomicFile::commit() {
  TESSEL_CHECK(file_ != nullptr && !committed_, "atomic write", "'{}' is already committed", path_);
  bool ok = std::fflush(file_) == 0 && ::fsync(::fileno(file_)) == 0;
  const int err = errno;
  ok = (std::fclose(file_) == 0) && ok;
  file_ = nullptr;
  TESSEL_CHECK(ok, "atomic write", "flushing '{}' failed: {}", temp_path(), std::strerror(err));
  TESSEL_CHECK(std::rename(temp_path().c_str(), path_.c_str()) == 0, "atomic write", "renaming '{}' to '{}' failed: {}",
               temp_path(), path_, std::strerror(errno));
  committed_ = true;
  fsync_dir(path_);
}

void write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFile f(path);
  f.write(content);
  f.commit();
}

void OutputDir::create() const {
  std::error_code ec;
  fs::create_directories(dir_, ec);
  TESSEL_CHECK(!ec && fs::is_directory(dir_), "output dir", "cannot create '{}': {}", dir_, ec.message());
}

bool OutputDir::exists() const {
  std::error_code ec;
  return fs::is_directory(dir_, ec);
}

std::string OutputDir::path(const std::string& name) const { return (fs::path(dir_) / name).string(); }

void OutputDir::write(const std::string& name, std::string_view content) const {
  create();
  write_file_atomic(path(name), content);
}

int OutputDir::remove_temporaries() const {
  if (!exists()) return 0;
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    if (e.is_regular_file() && e.path().extension() == ".tmp") {
      std::error_code ec;
      if (fs::remove(e.path(), ec)) ++n;
    }
  }
  return n;
}

}  // namespace tessel::train
