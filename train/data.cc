#include "train/data.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "autograd/ops/factory.h"
#include "autograd/ops/random.h"
#include "runtime/error.h"
#include "train/atomic_file.h"

namespace tessel::train {

namespace fs = std::filesystem;

std::vector<std::string> corpus_files(const std::string& path) {
  std::error_code ec;
  TESSEL_CHECK(fs::exists(path, ec), "corpus",
               "data path '{}' does not exist (the default corpus is the Debian 'fortunes' package: run tools/deps.sh, "
               "or pass a text file or folder)",
               path);
  if (!fs::is_directory(path, ec)) return {path};
  std::vector<std::string> files;
  for (const auto& e : fs::directory_iterator(path)) {
    if (!e.is_regular_file()) continue;
    const std::string ext = e.path().extension().string();
    if (ext == ".dat" || ext == ".u8") continue;
    files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  TESSEL_CHECK(!files.empty(), "corpus", "folder '{}' holds no text files (*.dat and *.u8 are skipped)", path);
  return files;
}

std::string load_corpus_text(const std::string& path) {
  std::string text;
  for (const auto& f : corpus_files(path)) text += read_file(f, "corpus");
  return text;
}

TokenSplit split_tokens(std::shared_ptr<const std::vector<int32_t>> tokens, double heldout_percent) {
  TESSEL_CHECK(heldout_percent >= 0 && heldout_percent < 100, "corpus", "held-out percent must be in [0, 100), got {}",
               heldout_percent);
  const int64_t n = int64_t(tokens->size());
  const int64_t h = int64_t(std::floor(double(n) * heldout_percent / 100.0));
  TokenSplit s;
  s.train = TokenSpan{tokens, 0, n - h};
  s.heldout = TokenSpan{tokens, n - h, h};
  return s;
}

Corpus load_corpus(const std::string& path, const Tokenizer& tokenizer, double heldout_percent) {
  Corpus c;
  c.path = path;
  c.files = corpus_files(path);
  std::string text;
  for (const auto& f : c.files) text += read_file(f, "corpus");
  c.num_bytes = int64_t(text.size());
  c.tokens = std::make_shared<const std::vector<int32_t>>(tokenizer.encode(text));
  c.split = split_tokens(c.tokens, heldout_percent);
  return c;
}

SampleRange split_range(int64_t total, int64_t parts, int64_t index) {
  TESSEL_CHECK(total >= 0 && parts > 0 && index >= 0 && index < parts, "split_range",
               "cannot take part {} of {} parts of {} items", index, parts, total);
  const int64_t chunk = (total + parts - 1) / parts;
  const int64_t begin = std::min(index * chunk, total);
  return {begin, std::min(begin + chunk, total)};
}

std::string LoaderState::to_json() const {
  nlohmann::ordered_json j;
  j["seed"] = seed;
  j["step"] = step;
  return j.dump();
}

LoaderState LoaderState::from_json(const std::string& text) {
  LoaderState s;
  try {
    auto j = nlohmann::json::parse(text);
    s.seed = j.at("seed").get<uint64_t>();
    s.step = j.at("step").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    TESSEL_FAIL("loader state", "cannot parse '{}': {}", text, e.what());
  }
  TESSEL_CHECK(s.step >= 0, "loader state", "step must be >= 0, got {}", s.step);
  return s;
}

DataLoader::DataLoader(TokenSpan tokens, int64_t seq_len, int64_t global_batch, uint64_t seed, std::string stream)
    : tokens_(std::move(tokens)), seq_len_(seq_len), global_batch_(global_batch), seed_(seed),
      stream_(std::move(stream)) {
  TESSEL_CHECK(tokens_.tokens != nullptr, "loader", "no token array");
  TESSEL_CHECK(seq_len_ > 0, "loader", "seq_len must be positive, got {}", seq_len_);
  TESSEL_CHECK(global_batch_ > 0, "loader", "the global batch size must be positive, got {}", global_batch_);
  TESSEL_CHECK(tokens_.size >= seq_len_ + 1, "loader",
               "the '{}' split has {} tokens, fewer than seq_len + 1 = {}: use a larger corpus or a shorter seq_len",
               stream_, tokens_.size, seq_len_ + 1);
  TESSEL_CHECK(tokens_.size - seq_len_ <= int64_t(UINT32_MAX), "loader",
               "the '{}' split has {} tokens; start positions are drawn with a 32-bit randint (at most 2^32 - 1)",
               stream_, tokens_.size);
}

PhiloxKey DataLoader::key(int64_t step) const {
  TESSEL_CHECK(step >= 0, "loader", "step must be >= 0, got {}", step);
  return PhiloxKey{seed_, stream_for(stream_, {uint64_t(step)})};
}

std::vector<int64_t> DataLoader::start_positions(int64_t step, int64_t first, int64_t count) const {
  TESSEL_CHECK(first >= 0 && count >= 0 && first + count <= global_batch_, "loader",
               "samples [{}, {}) are outside the global batch of {}", first, first + count, global_batch_);
  if (count == 0) return {};
  Tensor starts = randint(0, tokens_.size - seq_len_, {count}, key(step), TensorOptions(DType::Int64),
                          GlobalBlock{{global_batch_}, {first}});
  return starts.to_vector<int64_t>();
}

Batch DataLoader::samples(int64_t step, int64_t first, int64_t count) const {
  const std::vector<int64_t> starts = start_positions(step, first, count);
  Batch b;
  b.first_sample = first;
  b.inputs = empty({count, seq_len_}, TensorOptions(DType::Int64));
  b.targets = empty({count, seq_len_}, TensorOptions(DType::Int64));
  int64_t* in = b.inputs.data<int64_t>();
  int64_t* tg = b.targets.data<int64_t>();
  const int32_t* tok = tokens_.data();
  for (int64_t r = 0; r < count; ++r) {
    const int32_t* src = tok + starts[r];
    for (int64_t t = 0; t < seq_len_; ++t) {
      in[r * seq_len_ + t] = src[t];
      tg[r * seq_len_ + t] = src[t + 1];
    }
  }
  return b;
}

SampleRange DataLoader::micro_range(int64_t micro, int64_t num_micro, int64_t rank, int64_t world) const {
  const SampleRange r = split_range(global_batch_, world, rank);
  const SampleRange m = split_range(r.size(), num_micro, micro);
  return {r.begin + m.begin, r.begin + m.end};
}

Batch DataLoader::micro_batch(int64_t step, int64_t micro, int64_t num_micro, int64_t rank, int64_t world) const {
  const SampleRange r = micro_range(micro, num_micro, rank, world);
  return samples(step, r.begin, r.size());
}

void DataLoader::set_state(const LoaderState& s) {
  TESSEL_CHECK(s.step >= 0, "loader", "step must be >= 0, got {}", s.step);
  seed_ = s.seed;
  step_ = s.step;
}

Batch DataLoader::next(int64_t rank, int64_t world) {
  const SampleRange r = split_range(global_batch_, world, rank);
  Batch b = samples(step_, r.begin, r.size());
  ++step_;
  return b;
}

}  // namespace tessel::train
