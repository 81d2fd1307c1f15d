#include "checkpoint/manager.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <fmt/format.h>

#include "checkpoint/file_io.h"
#include "checkpoint/metadata.h"

namespace tessel::checkpoint {

namespace fs = std::filesystem;

namespace {

// step-N -> N; -1 for other names.
int64_t parse_step(const std::string& name) {
  constexpr const char* kPrefix = "step-";
  if (name.rfind(kPrefix, 0) != 0 || name.size() <= 5 || name.size() > 5 + 18) return -1;
  int64_t v = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    v = v * 10 + (name[i] - '0');
  }
  return v;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

void remove_dir_safely(const std::string& path) {
  const std::string doomed = path + ".deleting";
  if (std::rename(path.c_str(), doomed.c_str()) == 0) {
    io::fsync_dir(fs::path(path).parent_path().string());
    io::remove_tree(doomed);
  } else {
    io::remove_tree(path);
  }
}

}  // namespace

std::string step_dir(const std::string& root, int64_t step) {
  return (fs::path(root) / fmt::format(FMT_STRING("step-{:08d}"), step)).string();
}

std::vector<CheckpointEntry> list_checkpoints(const std::string& root) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return out;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t step = parse_step(name);
    if (step < 0 || !e.is_directory(ec)) continue;
    if (!io::exists((e.path() / kMetadataFile).string())) continue;
    out.push_back({step, e.path().string()});
  }
  std::sort(out.begin(), out.end(), [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return out;
}

std::optional<CheckpointEntry> latest_checkpoint(const std::string& root) {
  auto all = list_checkpoints(root);
  if (all.empty()) return std::nullopt;
  return all.back();
}

int prune_checkpoints(const std::string& root, int64_t keep_last, const std::string& in_progress) {
  int removed = 0;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return 0;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    if (name == in_progress) continue;
    const bool leftover = (ends_with(name, ".tmp") && parse_step(name.substr(0, name.size() - 4)) >= 0) ||
                          (ends_with(name, ".deleting") && parse_step(name.substr(0, name.size() - 9)) >= 0);
    if (leftover) {
      io::remove_tree(e.path().string());
      ++removed;
    }
  }
  if (keep_last > 0) {
    auto all = list_checkpoints(root);
    for (size_t i = 0; i + size_t(keep_last) < all.size(); ++i) {
      remove_dir_safely(all[i].path);
      ++removed;
    }
  }
  return removed;
}

}  // namespace tessel::checkpoint
