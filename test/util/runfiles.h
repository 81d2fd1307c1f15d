#pragma once
// Paths of test data files and a scratch folder, under `bazel test` and when
// a test binary is run by hand from the repository root.
#include <cstdlib>
#include <filesystem>
#include <string>

namespace tessel::testing {

// "test/data/<name>" inside the runfiles tree ($TEST_SRCDIR/$TEST_WORKSPACE),
// or relative to the current directory outside Bazel.
inline std::string data_path(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  std::string rel = "test/data/" + name;
  if (srcdir && workspace) return std::string(srcdir) + "/" + workspace + "/" + rel;
  return rel;
}

// A fresh, empty folder for this test's files: $TEST_TMPDIR/<name> (or the
// system temp folder outside Bazel).
inline std::string scratch_dir(const std::string& name) {
  namespace fs = std::filesystem;
  const char* tmp = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(tmp ? tmp : fs::temp_directory_path().string()) / ("tessel_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

}  // namespace tessel::testing
