#pragma once
// Tokenizers: text <-> token ids.
//
//   ByteTokenizer        vocab 256, token id = byte value (identity).
//   Gpt2BpeTokenizer     GPT-2's byte-level BPE, loaded from the usual
//                        vocab.json (token string -> id) and merges.txt
//                        (one "left right" pair per line, by rank).
//
// Gpt2BpeTokenizer follows openai/gpt-2 encoder.py exactly:
//   1. pre-tokenise with the regex
//        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//      (implemented by hand in pretokenize(); classes from train/unicode.h);
//   2. map each pre-token's UTF-8 bytes to printable characters with the
//      bytes-to-unicode table (bytes_to_unicode());
//   3. repeatedly merge the adjacent pair with the lowest merge rank (all of
//      its non-overlapping occurrences, left to right) until no pair has a rank;
//   4. look each resulting symbol up in the vocabulary.
// Results per pre-token are cached. Text that is not valid UTF-8 still
// round-trips: each invalid byte is a pre-token character of class "other".
// Special tokens such as <|endoftext|> are not recognised inside text (like
// tiktoken's encode_ordinary); get their ids with token_id().
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tessel::train {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Concatenated bytes of the tokens (may be invalid UTF-8 when a multi-byte
  // character is split across a cut). Throws tessel::Error on ids outside the vocabulary.
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual std::string name() const = 0;
  // The beginning- / end-of-sequence token where the tokenizer's files name
  // one (HfTokenizer); nullopt otherwise.
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }
  virtual std::optional<int32_t> eos_id() const { return std::nullopt; }
};

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int64_t vocab_size() const override { return 256; }
  std::string name() const override { return "byte"; }
};

// GPT-2's table: byte b -> one printable code point. Printable Latin-1 bytes
// ('!'..'~', '¡'..'¬', '®'..'ÿ') map to themselves, the 68 others to 256 + n in
// byte order (so ' ' -> U+0120 'Ġ', '\n' -> U+010A 'Ċ').
const std::vector<uint32_t>& bytes_to_unicode();

// Splits text into GPT-2 pre-tokens (views into `text`), by the regex above.
std::vector<std::string_view> pretokenize(std::string_view text);

// Splits text into LLaMA-3 pre-tokens (views into `text`) by the regex
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with the semantics of Oniguruma (what `tokenizers` runs it with): the first
// alternative that matches at a position wins, quantifiers backtrack. (?i:)
// also matches 'ſ' (U+017F, which case-folds to 's'). Same classes as pretokenize().
std::vector<std::string_view> pretokenize_llama3(std::string_view text);

// A token quoted for error messages: '...' with control bytes as \xNN.
std::string quote_token(std::string_view s);

class Gpt2BpeTokenizer final : public Tokenizer {
 public:
  // Loads vocab.json and merges.txt. Throws tessel::Error naming the file and
  // the offending line or key: unreadable file, bad JSON, non-integer or
  // duplicate ids, a token that is not made of bytes-to-unicode characters, a
  // byte symbol missing from the vocabulary, a malformed merges line, or a
  // merge whose parts or result are missing from the vocabulary.
  static std::shared_ptr<Gpt2BpeTokenizer> load(const std::string& vocab_json_path,
                                                const std::string& merges_txt_path);

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  // Largest id + 1 (GPT-2: 50257).
  int64_t vocab_size() const override { return int64_t(id_to_token_.size()); }
  std::string name() const override { return "gpt2-bpe"; }

  // The id of a vocabulary entry given in its vocab.json spelling ("Ġthe",
  // "<|endoftext|>"), if present.
  std::optional<int32_t> token_id(const std::string& token) const;
  int64_t num_merges() const { return int64_t(merge_ranks_.size()); }
  // The BPE symbols of one pre-token (vocab.json spelling), for tests and debugging.
  std::vector<std::string> bpe(std::string_view pretoken) const;

 private:
  Gpt2BpeTokenizer() = default;
  const std::vector<int32_t>& encode_word(std::string_view pretoken) const;

  std::unordered_map<std::string, int32_t> token_to_id_;
  std::vector<std::string> id_to_token_;   // "" for unused ids
  std::vector<std::string> id_to_bytes_;   // decoded bytes per id
  std::vector<bool> id_used_;
  std::unordered_map<std::string, int32_t> merge_ranks_;  // "left right" -> rank
  std::string byte_symbol_[256];           // UTF-8 of bytes_to_unicode()[b]

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// "byte" -> ByteTokenizer; "gpt2" -> Gpt2BpeTokenizer::load(path (vocab.json), merges_path);
// "hf" -> HfTokenizer::load(path (tokenizer.json)), train/hf_tokenizer.h.
std::shared_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& path = "",
                                          const std::string& merges_path = "");

}  // namespace tessel::train
