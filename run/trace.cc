#include "run/trace.h"

#include <cstring>
#include <filesystem>
#include <vector>

#include "autograd/api.h"
#include "runtime/comm/comm.h"
#include "runtime/error.h"
#include "train/atomic_file.h"

namespace tessel::detail {
namespace {

constexpr const char* kOp = "trace";

// The folder made first (a timeline's path is the user's); the file written
// atomically, so a viewer never opens half of one.
void write_file(const std::string& path, const std::string& text) {
  const std::filesystem::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path(), ec);
  TESSEL_CHECK(!ec, kOp, "cannot create the folder of the timeline '{}': {}", path, ec.message());
  train::write_file_atomic(path, text);
}

// Text in int64 words (the collectives move tensors), zero-padded.
Tensor words_of(const std::string& s, Device device) {
  std::vector<int64_t> w((s.size() + 7) / 8, 0);
  if (!s.empty()) std::memcpy(w.data(), s.data(), s.size());
  return tensor(w, Dims{int64_t(w.size())}, TensorOptions(DType::Int64)).to(device);
}

std::string text_of(const Tensor& words, int64_t bytes) {
  const std::vector<int64_t> w = words.to(kCPU).to_vector<int64_t>();
  std::string s(size_t(bytes), '\0');
  if (bytes > 0) std::memcpy(s.data(), w.data(), size_t(bytes));
  return s;
}

}  // namespace

std::string trace_rank_path(const std::string& path, int rank) {
  const std::filesystem::path p(path);
  const std::string name = p.stem().string() + ".rank" + std::to_string(rank) + p.extension().string();
  return (p.parent_path() / name).string();
}

void prepare_trace_file(const std::string& path, int rank, int ranks) {
  std::error_code ec;
  TESSEL_CHECK(!std::filesystem::is_directory(path, ec), kOp,
               "the timeline's path '{}' (RunOptions::trace, --trace) is a folder; give a file, e.g. '{}'", path,
               (std::filesystem::path(path) / "trace.json").string());
  write_file(ranks > 1 ? trace_rank_path(path, rank) : path, "");
}

std::string write_trace_files(const timeline::Recorder& r, const std::string& path, bool merge, Device device,
                              const std::string& meta) {
  const std::string mine = r.chrome_events();
  if (!comm::has_world() || comm::world()->size() == 1) {
    write_file(path, timeline::chrome_trace({mine}, meta));
    return path;
  }
  const comm::CommPtr world = comm::world();
  const int rank = world->rank(), n = world->size();
  write_file(trace_rank_path(path, rank), timeline::chrome_trace({mine}, meta));
  if (!merge) return "";
  // Every rank's byte count, then each rank's words to rank 0 in rank order.
  Tensor count = tensor(std::vector<int64_t>{int64_t(mine.size())}, Dims{1}, TensorOptions(DType::Int64)).to(device);
  Tensor counts = raw::empty(Dims{n}, DType::Int64, device);
  world->all_gather(count, counts)->wait();
  const std::vector<int64_t> bytes = counts.to(kCPU).to_vector<int64_t>();
  if (rank != 0) {
    if (bytes[size_t(rank)] > 0) world->send(words_of(mine, device), 0, /*tag=*/0x7ace)->wait();
    return "";
  }
  std::vector<std::string> all(static_cast<size_t>(n));
  all[0] = mine;
  for (int q = 1; q < n; ++q) {
    if (bytes[size_t(q)] == 0) continue;
    Tensor buf = raw::empty(Dims{(bytes[size_t(q)] + 7) / 8}, DType::Int64, device);
    world->recv(buf, q, /*tag=*/0x7ace)->wait();
    all[size_t(q)] = text_of(buf, bytes[size_t(q)]);
  }
  write_file(path, timeline::chrome_trace(all, meta));
  return path;
}

}  // namespace tessel::detail
