#include "train/data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include <nlohmann/json.hpp>

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

TokenSplit split_tokens(std::shared_ptr<const std::vector<int32_t>> tokens, double heldout_percent,
                        std::shared_ptr<const std::vector<uint8_t>> loss_mask) {
  TESSEL_CHECK(heldout_percent >= 0 && heldout_percent < 100, "corpus", "held-out percent must be in [0, 100), got {}",
               heldout_percent);
  TESSEL_CHECK(!loss_mask || loss_mask->size() == tokens->size(), "corpus",
               "the loss mask has {} entries for {} tokens", loss_mask ? loss_mask->size() : 0, tokens->size());
  const int64_t n = int64_t(tokens->size());
  const int64_t h = int64_t(std::floor(double(n) * heldout_percent / 100.0));
  TokenSplit s;
  s.train = TokenSpan{tokens, 0, n - h, loss_mask};
  s.heldout = TokenSpan{tokens, n - h, h, loss_mask};
  return s;
}

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Fine-tuning data (load_corpus's JSONL form).
Corpus load_jsonl(const std::string& path, const Tokenizer& tokenizer, double heldout_percent) {
  const char* op = "corpus";
  Corpus c;
  c.path = path;
  c.files = {path};
  const std::string text = read_file(path, op);
  c.num_bytes = int64_t(text.size());
  auto tokens = std::make_shared<std::vector<int32_t>>();
  auto mask = std::make_shared<std::vector<uint8_t>>();
  const std::optional<int32_t> eos = tokenizer.eos_id();
  auto string_field = [&](const nlohmann::json& j, const char* key, int64_t line) {
    TESSEL_CHECK(j[key].is_string(), op, "{}:{}: \"{}\" must be a string, got {}", path, line, key, j[key].dump());
    return j[key].get<std::string>();
  };
  int64_t line_no = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    const std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      TESSEL_FAIL(op, "{}:{}: not valid JSON: {}", path, line_no, e.what());
    }
    TESSEL_CHECK(j.is_object(), op, "{}:{}: each line must be a JSON object, got {}", path, line_no,
                 j.type_name());
    std::vector<int32_t> ids;
    size_t targets_from = 0;
    if (j.contains("prompt") || j.contains("completion")) {
      TESSEL_CHECK(j.contains("prompt") && j.contains("completion"), op,
                   "{}:{}: a fine-tuning example needs both \"prompt\" and \"completion\"", path, line_no);
      const std::string prompt = string_field(j, "prompt", line_no);
      const std::string completion = string_field(j, "completion", line_no);
      TESSEL_CHECK(!completion.empty(), op, "{}:{}: the completion is empty", path, line_no);
      const std::vector<int32_t> p = tokenizer.encode(prompt);
      ids = tokenizer.encode(prompt + completion);
      // The prompt's tokens, as far as encoding them together kept them.
      while (targets_from < p.size() && targets_from < ids.size() && ids[targets_from] == p[targets_from])
        ++targets_from;
    } else {
      TESSEL_CHECK(j.contains("text"), op,
                   "{}:{}: expected {{\"prompt\", \"completion\"}} or {{\"text\"}}, got the keys {}", path,
                   line_no, [&] {
                     std::string keys;
                     for (const auto& [k, v] : j.items()) keys += (keys.empty() ? "" : ", ") + k;
                     return keys.empty() ? std::string("(none)") : keys;
                   }());
      ids = tokenizer.encode(string_field(j, "text", line_no));
    }
    if (eos) ids.push_back(*eos);
    for (size_t i = 0; i < ids.size(); ++i) {
      tokens->push_back(ids[i]);
      mask->push_back(i >= targets_from ? 1 : 0);
    }
    ++c.num_examples;
  }
  TESSEL_CHECK(c.num_examples > 0, op, "{}: no examples (one JSON object per line)", path);
  TESSEL_CHECK(std::find(mask->begin(), mask->end(), 1) != mask->end(), op, "{}: no example has a target token",
               path);
  c.tokens = tokens;
  c.loss_mask = mask;
  c.split = split_tokens(c.tokens, heldout_percent, c.loss_mask);
  return c;
}

}  // namespace

Corpus load_corpus(const std::string& path, const Tokenizer& tokenizer, double heldout_percent) {
  if (ends_with(path, ".jsonl")) return load_jsonl(path, tokenizer, heldout_percent);
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
  const uint8_t* mask = tokens_.loss_mask ? tokens_.loss_mask->data() + tokens_.begin : nullptr;
  for (int64_t r = 0; r < count; ++r) {
    const int32_t* src = tok + starts[r];
    for (int64_t t = 0; t < seq_len_; ++t) {
      in[r * seq_len_ + t] = src[t];
      tg[r * seq_len_ + t] = !mask || mask[starts[r] + t + 1] ? src[t + 1] : kIgnoreTarget;
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
