#include "checkpoint/hf_reader.h"

#include <fcntl.h>

#include <algorithm>
#include <filesystem>
#include <regex>

#include <nlohmann/json.hpp>

#include "autograd/api.h"
#include "checkpoint/hf.h"
#include "checkpoint/load.h"
#include "checkpoint/metadata.h"
#include "runtime/error.h"

namespace tessel::checkpoint {
namespace {

constexpr const char* kOp = "hf load";

// Row-major strides of `shape`, in elements.
Dims row_major_strides(const Dims& shape) {
  Dims s = shape;
  int64_t acc = 1;
  for (int d = shape.size() - 1; d >= 0; --d) {
    s[d] = acc;
    acc *= shape[d];
  }
  return s;
}

// Coordinates of row-major element `flat` of a tensor of `shape`.
Dims coords_of(int64_t flat, const Dims& shape) {
  Dims c = shape;
  for (int d = shape.size() - 1; d >= 0; --d) {
    c[d] = shape[d] == 0 ? 0 : flat % shape[d];
    flat = shape[d] == 0 ? flat : flat / shape[d];
  }
  return c;
}

// A box of a tessel parameter, seen in its file tensor: the file box to read
// (row-major into a buffer) and the strides that lay the buffer out as the
// parameter's box.
struct FileBox {
  Box box;
  Dims strides;  // of the parameter box's dims, in elements of the buffer
};

FileBox file_box_of(const HfView& v, const Dims& file_shape, const Box& piece) {
  const int m = piece.size.size();
  int64_t lo = v.offset, hi = v.offset;
  for (int j = 0; j < m; ++j) {
    lo += piece.offset[j] * v.strides[j];
    hi += (piece.offset[j] + piece.size[j] - 1) * v.strides[j];
  }
  const Dims first = coords_of(lo, file_shape), last = coords_of(hi, file_shape);
  FileBox fb;
  fb.box.offset = first;
  fb.box.size = first;
  for (int k = 0; k < first.size(); ++k) fb.box.size[k] = last[k] - first[k] + 1;
  // Every view from_hf makes is a transposed or offset box of its file
  // tensor, so the parameter box is a whole file box: anything else is a bug
  // in the map, and reading the covering box would be a silent wrong answer.
  TESSEL_CHECK(fb.box.numel() == piece.numel(), kOp,
               "internal: '{}' (view of '{}', strides {}) is not a box of the file tensor {}", v.name, v.hf_name,
               v.strides.str(), file_shape.str());
  const Dims buf = row_major_strides(fb.box.size);
  fb.strides = Dims::filled(m, 0);
  for (int j = 0; j < m; ++j) {
    if (piece.size[j] < 2) continue;
    const Dims next = coords_of(lo + v.strides[j], file_shape);
    for (int k = 0; k < first.size(); ++k) fb.strides[j] += (next[k] - first[k]) * buf[k];
  }
  return fb;
}

// model-00001-of-00003.safetensors: the names save_pretrained gives shards.
bool is_shard_name(const std::string& f) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return std::regex_match(f, shard);
}

}  // namespace

struct HfFolderReader::Shard {
  std::string name;
  io::File file;
};

HfFolderReader::HfFolderReader(std::string dir) : dir_(std::move(dir)) {
  const std::string index = dir_ + "/model.safetensors.index.json", single = "model.safetensors";
  // file name -> the tensors the index puts in it (empty: take all of them)
  std::map<std::string, std::vector<std::string>> by_file;
  if (!io::exists(index)) {
    TESSEL_CHECK(io::exists(dir_ + "/" + single), kOp,
                 "'{}' has neither model.safetensors nor model.safetensors.index.json", dir_);
    by_file[single];
  } else {
    const std::string text = io::read_file(index, kOp);
    bytes_read_ += text.size();
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      TESSEL_FAIL(kOp, "'{}' is not valid JSON: {}", index, e.what());
    }
    TESSEL_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), kOp, "'{}' has no weight_map object", index);
    for (const auto& [name, file] : j["weight_map"].items()) {
      TESSEL_CHECK(file.is_string() && is_plain_file_name(file.get<std::string>()), kOp,
                   "'{}': tensor '{}' maps to {}, not a file name", index, name, file.dump());
      by_file[file.get<std::string>()].push_back(name);
    }
  }
  // A shard-named file the index does not list is a leftover of another save
  // (or an index that lost entries): reading around it could mix two models.
  if (io::exists(index))
    for (const auto& e : std::filesystem::directory_iterator(dir_)) {
      const std::string f = e.path().filename().string();
      if (is_shard_name(f))
        TESSEL_CHECK(by_file.count(f), kOp,
                     "'{}': shard '{}' is not in model.safetensors.index.json ({} shards listed): a leftover of "
                     "another save? Remove it or fix the index",
                     dir_, f, by_file.size());
    }
  for (const auto& [file, names] : by_file) {
    const std::string path = dir_ + "/" + file;
    TESSEL_CHECK(io::exists(path), kOp, "'{}': shard '{}' is missing (the index puts {} tensors in it, e.g. '{}')",
                 dir_, file, names.size(), names.empty() ? "" : names.front());
    auto shard = std::make_unique<Shard>();
    shard->name = file;
    shard->file = io::File(path, O_RDONLY, kOp);
    const uint64_t size = shard->file.size(kOp);
    char prefix[8] = {};
    TESSEL_CHECK(size >= 8, kOp, "'{}' is {} bytes long, too short for the 8-byte header length", path, size);
    shard->file.pread_all(prefix, 8, 0, kOp, "the header length");
    const uint64_t n = safetensors_header_length(std::string_view(prefix, 8), size, path);
    std::string head(8 + n, '\0');
    shard->file.pread_all(head.data(), head.size(), 0, kOp, "the header");
    bytes_read_ += head.size();
    const SafetensorsHeader h = parse_safetensors_header(head, size, path);
    const size_t s = shards_.size();
    shards_.push_back(std::move(shard));
    auto add = [&](const SafetensorsEntry& e) {
      TESSEL_CHECK(!entries_.count(e.name), kOp, "'{}': tensor '{}' is in two shards ('{}' and '{}')", dir_, e.name,
                   shards_[entries_.at(e.name).shard]->name, file);
      entries_[e.name] = Entry{s, e};
    };
    if (names.empty()) {
      for (const SafetensorsEntry& e : h.entries) add(e);
    } else {
      for (const std::string& name : names) {
        const SafetensorsEntry* e = h.find(name);
        TESSEL_CHECK(e != nullptr, kOp, "'{}': the index puts tensor '{}' in '{}', which does not hold it", dir_, name,
                     file);
        add(*e);
      }
    }
  }
  for (const auto& [name, e] : entries_) {
    specs_.push_back(TensorSpec{name, e.entry.dtype, e.entry.shape});
    tensor_bytes_ += e.entry.end - e.entry.begin;
  }
}

HfFolderReader::~HfFolderReader() = default;

void HfFolderReader::read(const std::string& name, const Box& box, void* dst) {
  auto it = entries_.find(name);
  TESSEL_CHECK(it != entries_.end(), kOp, "'{}' has no tensor '{}'", dir_, name);
  const SafetensorsEntry& e = it->second.entry;
  const Box whole{Dims::filled(e.shape.size(), 0), e.shape};
  Box region;
  TESSEL_CHECK(box.numel() == 0 || (intersect(whole, box, &region) && region.numel() == box.numel()), kOp,
               "'{}': box {} + {} is outside tensor '{}' {}", dir_, box.offset.str(), box.size.str(), name,
               e.shape.str());
  if (box.numel() == 0) return;
  const size_t item = itemsize(e.dtype);
  Shard& shard = *shards_[it->second.shard];
  char* out = static_cast<char*>(dst);
  // Runs that follow each other in the file and in dst become one pread.
  uint64_t run_src = 0, run_dst = 0, run_bytes = 0;
  auto flush = [&] {
    if (run_bytes == 0) return;
    if (out) shard.file.pread_all(out + run_dst, run_bytes, e.begin + run_src, kOp, "tensor '" + name + "'");
    bytes_read_ += run_bytes;
    run_bytes = 0;
  };
  for_each_run(whole, box, box, [&](int64_t s, int64_t d, int64_t n) {
    const uint64_t sb = uint64_t(s) * item, db = uint64_t(d) * item, nb = uint64_t(n) * item;
    if (run_bytes > 0 && run_src + run_bytes == sb && run_dst + run_bytes == db) {
      run_bytes += nb;
      return;
    }
    flush();
    run_src = sb;
    run_dst = db;
    run_bytes = nb;
  });
  flush();
}

HfLoadResult load_hf(HfFolderReader& reader, const models::ModelConfig& config, const NamedTensors& targets,
                     const HfLoadOptions& options) {
  // The map (and its checks: every parameter found, every file tensor used).
  std::map<std::string, HfView> views;
  for (HfView& v : hf_views(config, reader.tensors())) views.emplace(v.name, std::move(v));
  std::map<std::string, const TensorSpec*> specs;
  for (const TensorSpec& s : reader.tensors()) specs[s.name] = &s;
  for (const auto& [name, t] : targets) {
    TESSEL_CHECK(t.defined(), kOp, "target '{}' is undefined", name);
    auto it = views.find(name);
    TESSEL_CHECK(it != views.end(), kOp, "'{}' has no weight for '{}' (after mapping Hugging Face names)",
                 reader.dir(), name);
    TESSEL_CHECK(it->second.shape == t.shape(), kOp, "'{}': '{}' (from '{}') is {} but this model's is {}",
                 reader.dir(), name, it->second.hf_name, it->second.shape.str(), t.shape().str());
    TESSEL_CHECK(options.count_only || !raw::local_of(t).device().is_meta(), kOp,
                 "target '{}' is a Meta tensor: only count_only loads take those", name);
  }
  HfLoadResult result;
  const uint64_t before = reader.bytes_read();
  NoGradGuard ng;
  for (const auto& [name, t] : targets) {
    const HfView& v = views.at(name);
    const TensorSpec& spec = *specs.at(v.hf_name);
    const Tensor& local = raw::local_of(t);
    const auto [piece, zero] = local_piece(t);
    ++result.tensors;
    if (piece.numel() == 0) continue;
    if (zero) {
      if (!options.count_only) Tensor(local).zero_();
      continue;
    }
    const FileBox fb = file_box_of(v, spec.shape, piece);
    if (options.count_only) {
      reader.read(v.hf_name, fb.box, nullptr);
      continue;
    }
    Tensor buf = raw::empty(fb.box.size, spec.dtype, kCPU);
    reader.read(v.hf_name, fb.box, buf.raw_data());
    const Tensor values = raw::as_strided(buf, piece.size, fb.strides, 0).to(t.dtype());
    Tensor(local).copy_(values);
    local.bump_version();
  }
  result.bytes_read = reader.bytes_read() - before;
  return result;
}

}  // namespace tessel::checkpoint
