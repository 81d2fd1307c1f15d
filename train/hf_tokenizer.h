#pragma once
// HfTokenizer: a BPE tokenizer read from the tokenizer.json file that Hugging
// Face ships with a model, encoding and decoding as PyPI's `tokenizers` does
// (checked token for token by `./tessel conformance --tokenizers`).
//
// Supported (anything else is a tessel::Error naming the file, the JSON path
// and what is supported):
//   model          BPE: vocab, merges ("a b" strings or ["a", "b"] pairs),
//                  unk_token, fuse_unk, byte_fallback (needs all 256 <0xNN>
//                  tokens), ignore_merges; dropout null or 0; no
//                  continuing_subword_prefix / end_of_word_suffix.
//   normalizer     null, Prepend, Replace (String pattern), Sequence of those
//                  (LLaMA-2 / Mixtral: Sequence[Prepend("▁"), Replace(" ", "▁")]).
//   pre_tokenizer  null; ByteLevel (add_prefix_space, use_regex: GPT-2's
//                  regex); Metaspace (replacement, prepend_scheme or the older
//                  add_prefix_space, split); Split with GPT-2's or LLaMA-3's
//                  regex (behavior Isolated, invert false); Sequence of those.
//                  The regexes are implemented by hand (pretokenize(),
//                  pretokenize_llama3()); no regex engine.
//   post_processor null; TemplateProcessing (single sequences); ByteLevel
//                  (offsets only: no ids); Sequence of those.
//   decoder        null (tokens joined by " ", as `tokenizers` does); ByteLevel;
//                  Metaspace; Replace (String pattern); ByteFallback; Fuse;
//                  Strip; Sequence of those.
//   added_tokens   matched in the text before pre-tokenization (longest match
//                  at the leftmost position, as `tokenizers`), special or not;
//                  normalized ones are matched in the normalized text;
//                  lstrip / rstrip; single_word is not supported.
//   truncation and padding must be null.
//
// Differences from `tokenizers`, on purpose:
//   - decode() returns the tokens' bytes: where `tokenizers` would replace
//     invalid UTF-8 with U+FFFD (a byte-level token sequence cut inside a
//     character, lone <0xNN> bytes), tessel keeps the bytes (so decoding
//     sample by sample and concatenating gives the same bytes).
//   - an id outside the vocabulary is an error in decode() (`tokenizers`
//     skips it), and so is a character that is neither in the vocabulary nor
//     covered by byte_fallback / unk_token (`tokenizers` drops it).
//   - text that is not valid UTF-8 (which `tokenizers` cannot take) encodes
//     with each invalid byte as one character of class "other": byte-level
//     files round-trip it, byte_fallback files give its <0xNN> token.
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "train/tokenizer.h"

namespace tessel::train {

struct HfEncodeOptions {
  // Apply the post-processor's template (LLaMA: prepend <s> / <|begin_of_text|>);
  // `tokenizers`' encode(add_special_tokens=...).
  bool add_special_tokens = true;
  // Find special added tokens in the text; false encodes "<s>" in the text as
  // ordinary text (`tokenizers`' encode_special_tokens = True). Added tokens
  // that are not special are matched either way.
  bool match_special_tokens = true;
};

class HfTokenizer final : public Tokenizer {
 public:
  // Reads a tokenizer.json. Throws tessel::Error naming the file, the JSON
  // path and what is supported (see above), for unreadable files, bad JSON,
  // unsupported components, missing vocab/merges, duplicate ids, merges whose
  // parts or result are not in the vocabulary, inconsistent added tokens.
  static std::shared_ptr<HfTokenizer> load(const std::string& tokenizer_json_path);
  // The same from the file's text; `source` names it in errors.
  static std::shared_ptr<HfTokenizer> parse(const std::string& json_text, const std::string& source);

  // add_special_tokens = true, match_special_tokens = true (`tokenizers`' encode(text)).
  std::vector<int32_t> encode(std::string_view text) const override;
  std::vector<int32_t> encode(std::string_view text, const HfEncodeOptions& options) const;
  // Every id, special tokens included (`tokenizers`' decode(ids,
  // skip_special_tokens=False)), through the file's decoder. Throws naming
  // the id, its position and the vocabulary size for an unknown id.
  std::string decode(const std::vector<int32_t>& ids) const override;
  // Largest id (model vocabulary or added token) + 1.
  int64_t vocab_size() const override { return int64_t(id_to_token_.size()); }
  std::string name() const override { return "hf-bpe"; }
  // The template's special token before the sequence (<s>), if any, unless
  // set_bos_eos() named one.
  std::optional<int32_t> bos_id() const override { return bos_; }
  // The template's special token after the sequence, if any, unless set_bos_eos() named one.
  std::optional<int32_t> eos_id() const override { return eos_; }
  // Names BOS / EOS by token content (tokenizer_config.json's bos_token /
  // eos_token); an empty string leaves that one as it is. Throws when the
  // content is not a token.
  void set_bos_eos(const std::string& bos_token, const std::string& eos_token);

  // The id of a token given in its tokenizer.json spelling ("Ġthe", "▁the",
  // "<s>"), model vocabulary or added token.
  std::optional<int32_t> token_id(const std::string& token) const;
  // The tokenizer.json spelling of an id; throws for an unknown id.
  const std::string& id_to_token(int32_t id) const;
  int64_t num_merges() const { return num_merges_; }

 private:
  struct Impl;
  HfTokenizer();
  std::vector<int32_t> bpe_piece(const std::string& piece) const;

  std::shared_ptr<const Impl> impl_;
  std::vector<std::string> id_to_token_;  // "" for unused ids
  std::vector<bool> id_used_;
  std::optional<int32_t> bos_, eos_;
  int64_t num_merges_ = 0;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

// The tokenizer of a Hugging Face model folder: its tokenizer.json (with BOS
// and EOS from tokenizer_config.json's bos_token / eos_token when that file
// names them), or nullptr when the folder has no tokenizer.json. Throws when
// `dir` is not a folder or a file in it is bad.
std::shared_ptr<Tokenizer> load_tokenizer_dir(const std::string& dir);

}  // namespace tessel::train
