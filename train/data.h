#pragma once
// Training text: corpus loading, the token array and its train/held-out
// split, and the deterministic batch loader.
//
// The loader's contract (what makes data parallelism and gradient
// accumulation bit-exact): the global batch of step `s` has B sequences of
// T + 1 tokens. Sample i (0 <= i < B, the *global sample index*) starts at
//
//   start(s, i) = randint(0, N - T) at global element i of a [B] tensor, key
//                 {seed, stream_for(stream, {s})}     (stream = "data")
//               = philox::bounded(philox::bits_at(key, i), N - T)
//
// where N is the number of tokens in the split. inputs[i] = tokens[start ..
// start + T), targets[i] = tokens[start + 1 .. start + T + 1). Nothing else
// enters: a micro-batch or a data-parallel rank holding the contiguous sample
// range [first, first + count) gets exactly those rows of the full batch, for
// any split. Ranks and micro-batches own ranges by ceil-division
// (split_range): rank r of W owns split_range(B, W, r); micro-batch m of M
// inside it owns split_range of that range.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/philox.h"
#include "runtime/tensor.h"
#include "train/tokenizer.h"

namespace tessel::train {

inline constexpr const char* kDefaultCorpus = "/usr/share/games/fortunes";

// The files a corpus path stands for: the path itself if it is a file; for a
// folder, its regular files (not recursive) except "*.dat" (fortune index
// files) and "*.u8" (UTF-8 duplicates), sorted by name. Throws tessel::Error
// when the path does not exist or the folder holds no usable file.
std::vector<std::string> corpus_files(const std::string& path);
// The files' bytes, concatenated in that order.
std::string load_corpus_text(const std::string& path);

// A contiguous range of a shared token array, and optionally which of its
// tokens are loss targets (fine-tuning data: a completion's tokens are, its
// prompt's are not). A batch's target at a position whose mask is 0 is
// kIgnoreTarget, which the loss skips (cross_entropy's ignore_index).
inline constexpr int64_t kIgnoreTarget = -100;
struct TokenSpan {
  std::shared_ptr<const std::vector<int32_t>> tokens;
  int64_t begin = 0;
  int64_t size = 0;
  std::shared_ptr<const std::vector<uint8_t>> loss_mask;  // parallel to tokens; null: every token is a target
  const int32_t* data() const { return tokens->data() + begin; }
};

// Splits [0, n) into the train part [0, n - h) and the held-out part
// [n - h, n), h = floor(n * heldout_percent / 100).
struct TokenSplit {
  TokenSpan train;
  TokenSpan heldout;
};
TokenSplit split_tokens(std::shared_ptr<const std::vector<int32_t>> tokens, double heldout_percent,
                        std::shared_ptr<const std::vector<uint8_t>> loss_mask = nullptr);

struct Corpus {
  std::string path;
  std::vector<std::string> files;
  int64_t num_bytes = 0;
  std::shared_ptr<const std::vector<int32_t>> tokens;  // the whole corpus, tokenised once
  std::shared_ptr<const std::vector<uint8_t>> loss_mask;  // fine-tuning data: 1 = a target; null: all
  int64_t num_examples = 0;  // fine-tuning data: the JSONL lines
  TokenSplit split;
};
// Reads, tokenises (once) and splits a corpus.
//
// A path ending in ".jsonl" is fine-tuning data, one JSON object per line:
//   {"prompt": "...", "completion": "..."}  the loss is on the completion only
//   {"text": "..."}                         the loss is on every token
// Examples are packed in file order into one token stream (the loader takes
// windows of it like any corpus), each followed by the tokenizer's EOS token
// when it has one (a target). The prompt's tokens are encode(prompt); the
// completion's are the rest of encode(prompt + completion). Errors name the
// file and line: not JSON, not an object, missing or non-string fields, an
// empty completion, no target token in the whole file.
Corpus load_corpus(const std::string& path, const Tokenizer& tokenizer, double heldout_percent = 10.0);

// [begin, end) of part `index` when `total` items are split into `parts`
// contiguous parts by ceil-division (the last parts may be smaller or empty).
struct SampleRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
SampleRange split_range(int64_t total, int64_t parts, int64_t index);

struct Batch {
  Tensor inputs;   // [b, T] int64
  Tensor targets;  // [b, T] int64: inputs shifted by one token
  int64_t first_sample = 0;  // global sample index of row 0
  int64_t size() const { return inputs.defined() ? inputs.size(0) : 0; }
};

// Everything a loader needs to continue where it stopped (checkpointed with the model).
struct LoaderState {
  uint64_t seed = 0;
  int64_t step = 0;  // the step next() draws
  std::string to_json() const;
  static LoaderState from_json(const std::string& json);
  bool operator==(const LoaderState& o) const { return seed == o.seed && step == o.step; }
};

class DataLoader {
 public:
  // Throws tessel::Error when the span has fewer than seq_len + 1 tokens, or
  // on non-positive sizes. `stream` separates loaders that share a seed
  // ("data" for training, "eval" for held-out batches).
  DataLoader(TokenSpan tokens, int64_t seq_len, int64_t global_batch, uint64_t seed, std::string stream = "data");

  // Pure functions of (seed, step, sample index):
  // start positions of samples [first, first + count) of step `step`.
  std::vector<int64_t> start_positions(int64_t step, int64_t first, int64_t count) const;
  // Those samples as a batch.
  Batch samples(int64_t step, int64_t first, int64_t count) const;
  // The whole global batch of a step.
  Batch global_batch(int64_t step) const { return samples(step, 0, global_batch_); }
  // Micro-batch `micro` of `num_micro` on data-parallel rank `rank` of `world`.
  Batch micro_batch(int64_t step, int64_t micro, int64_t num_micro, int64_t rank = 0, int64_t world = 1) const;
  SampleRange micro_range(int64_t micro, int64_t num_micro, int64_t rank = 0, int64_t world = 1) const;
  PhiloxKey key(int64_t step) const;

  // Stateful use: the step to draw next.
  LoaderState state() const { return {seed_, step_}; }
  void set_state(const LoaderState& s);
  int64_t step() const { return step_; }
  // The global batch (or this rank's part of it) at step(), then step() + 1.
  Batch next(int64_t rank = 0, int64_t world = 1);

  int64_t seq_len() const { return seq_len_; }
  int64_t global_batch_size() const { return global_batch_; }
  int64_t num_tokens() const { return tokens_.size; }

 private:
  TokenSpan tokens_;
  int64_t seq_len_;
  int64_t global_batch_;
  uint64_t seed_;
  std::string stream_;
  int64_t step_ = 0;
};

}  // namespace tessel::train
