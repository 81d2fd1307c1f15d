#include "train/tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>

#include "runtime/error.h"
#include "train/atomic_file.h"
#include "train/hf_tokenizer.h"
#include "train/unicode.h"

namespace tessel::train {

namespace {
constexpr const char* kOp = "gpt2-bpe";
constexpr size_t kMaxCacheEntries = size_t(1) << 17;

// Code point -> byte for the bytes-to-unicode table (-1: not in the table).
const std::vector<int>& unicode_to_byte() {
  static const std::vector<int> table = [] {
    std::vector<int> t(512, -1);
    const auto& b2u = bytes_to_unicode();
    for (int b = 0; b < 256; ++b) t[b2u[b]] = b;
    return t;
  }();
  return table;
}

enum class CharClass { Letter, Number, Space, Other };
CharClass classify(uint32_t cp) {
  if (unicode::is_letter(cp)) return CharClass::Letter;
  if (unicode::is_number(cp)) return CharClass::Number;
  if (unicode::is_whitespace(cp)) return CharClass::Space;
  return CharClass::Other;
}

// The code points of a text and their classes, as the pre-tokenisers read them.
struct ClassifiedText {
  std::vector<unicode::CodePoint> cps;
  std::vector<CharClass> cls;
  explicit ClassifiedText(std::string_view text) : cps(unicode::decode_utf8(text)), cls(cps.size()) {
    for (size_t i = 0; i < cps.size(); ++i) cls[i] = classify(cps[i].cp);
  }
  uint32_t cp(size_t i) const { return i < cps.size() ? cps[i].cp : 0u; }
  // The view of text covering code points [begin, end).
  std::string_view piece(std::string_view text, size_t begin, size_t end) const {
    const size_t lo = cps[begin].offset, hi = cps[end - 1].offset + cps[end - 1].length;
    return text.substr(lo, hi - lo);
  }
};
}  // namespace

std::string quote_token(std::string_view s) {
  std::string out = "'";
  for (unsigned char c : s) {
    if (c < 0x20 || c == 0x7f) out += fmt::format(FMT_STRING("\\x{:02x}"), c);
    else out.push_back(char(c));
  }
  return out + "'";
}

// ---- ByteTokenizer -----------------------------------------------------------

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = int32_t(static_cast<unsigned char>(text[i]));
  return ids;
}

std::string ByteTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) {
    TESSEL_CHECK(ids[i] >= 0 && ids[i] < 256, "byte tokenizer", "decode: id {} at position {} is outside [0, 256)",
                 ids[i], i);
    out[i] = char(uint8_t(ids[i]));
  }
  return out;
}

// ---- GPT-2 tables and pre-tokenisation -----------------------------------------

const std::vector<uint32_t>& bytes_to_unicode() {
  static const std::vector<uint32_t> table = [] {
    std::vector<uint32_t> t(256, 0);
    std::vector<bool> printable(256, false);
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) t[b] = printable[b] ? uint32_t(b) : 256 + n++;
    return t;
  }();
  return table;
}

std::vector<std::string_view> pretokenize(std::string_view text) {
  const ClassifiedText t(text);
  const auto& cls = t.cls;
  const size_t n = cls.size();
  auto cp = [&](size_t i) { return t.cp(i); };

  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < n) {
    size_t end = 0;
    // 's|'t|'re|'ve|'m|'ll|'d  (ASCII apostrophe, lower case only)
    if (cp(i) == '\'') {
      uint32_t a = cp(i + 1), b = cp(i + 2);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') end = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) end = i + 3;
    }
    //  ?\p{L}+ |  ?\p{N}+ |  ?[^\s\p{L}\p{N}]+  (classes are disjoint: at most one applies)
    if (end == 0) {
      size_t k = (cp(i) == ' ' && i + 1 < n && cls[i + 1] != CharClass::Space) ? i + 1 : i;
      CharClass c = cls[k];
      if (c != CharClass::Space) {
        end = k + 1;
        while (end < n && cls[end] == c) ++end;
      }
    }
    // \s+(?!\S) | \s+ : a whitespace run; when a non-space follows, its last
    // character is left to prefix the next token (unless the run is one character).
    if (end == 0) {
      size_t j = i + 1;
      while (j < n && cls[j] == CharClass::Space) ++j;
      end = (j < n && j - i >= 2) ? j - 1 : j;
    }
    out.push_back(t.piece(text, i, end));
    i = end;
  }
  return out;
}

std::vector<std::string_view> pretokenize_llama3(std::string_view text) {
  const ClassifiedText t(text);
  const auto& cls = t.cls;
  const size_t n = cls.size();
  auto cp = [&](size_t i) { return t.cp(i); };
  auto is_crlf = [&](size_t i) { return cp(i) == '\r' || cp(i) == '\n'; };
  // Oniguruma's case folding under (?i:): ASCII letters, and U+017F LATIN SMALL LETTER LONG S -> 's'.
  auto folded = [&](size_t i) -> uint32_t {
    const uint32_t c = cp(i);
    if (c >= 'A' && c <= 'Z') return c + ('a' - 'A');
    if (c == 0x17F) return 's';
    return c;
  };

  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < n) {
    size_t end = 0;
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (cp(i) == '\'') {
      const uint32_t a = folded(i + 1), b = folded(i + 2);
      if (a == 's' || a == 't' || a == 'm' || a == 'd') end = i + 2;
      else if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) end = i + 3;
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (end == 0) {
      size_t k = n;
      if (i + 1 < n && cls[i] != CharClass::Letter && cls[i] != CharClass::Number && !is_crlf(i) &&
          cls[i + 1] == CharClass::Letter)
        k = i + 1;
      else if (cls[i] == CharClass::Letter)
        k = i;
      if (k < n) {
        end = k + 1;
        while (end < n && cls[end] == CharClass::Letter) ++end;
      }
    }
    // \p{N}{1,3}
    if (end == 0 && cls[i] == CharClass::Number) {
      end = i + 1;
      while (end < n && end < i + 3 && cls[end] == CharClass::Number) ++end;
    }
    //  ?[^\s\p{L}\p{N}]+[\r\n]*
    if (end == 0) {
      const size_t k = (cp(i) == ' ' && i + 1 < n && cls[i + 1] == CharClass::Other) ? i + 1 : i;
      if (cls[k] == CharClass::Other) {
        end = k + 1;
        while (end < n && cls[end] == CharClass::Other) ++end;
        while (is_crlf(end)) ++end;
      }
    }
    // Only whitespace is left at i.
    if (end == 0) {
      size_t j = i + 1;
      while (j < n && cls[j] == CharClass::Space) ++j;
      // \s*[\r\n]+ : up to the last CR/LF of the run, if it has one.
      for (size_t k = j; k > i && end == 0; --k)
        if (is_crlf(k - 1)) end = k;
      // \s+(?!\S) | \s+ : as in pretokenize().
      if (end == 0) end = (j < n && j - i >= 2) ? j - 1 : j;
    }
    out.push_back(t.piece(text, i, end));
    i = end;
  }
  return out;
}

// ---- Gpt2BpeTokenizer: loading -------------------------------------------------

std::shared_ptr<Gpt2BpeTokenizer> Gpt2BpeTokenizer::load(const std::string& vocab_path,
                                                         const std::string& merges_path) {
  std::shared_ptr<Gpt2BpeTokenizer> tok(new Gpt2BpeTokenizer());
  const auto& b2u = bytes_to_unicode();
  const auto& u2b = unicode_to_byte();
  for (int b = 0; b < 256; ++b) unicode::append_utf8(tok->byte_symbol_[b], b2u[b]);

  // vocab.json: {"token": id, ...}
  const std::string vocab_text = read_file(vocab_path, kOp);
  nlohmann::json vocab;
  try {
    vocab = nlohmann::json::parse(vocab_text);
  } catch (const nlohmann::json::exception& e) {
    TESSEL_FAIL(kOp, "{}: invalid JSON: {}", vocab_path, e.what());
  }
  TESSEL_CHECK(vocab.is_object(), kOp, "{}: expected a JSON object mapping token strings to ids, got a {}",
               vocab_path, vocab.type_name());
  TESSEL_CHECK(!vocab.empty(), kOp, "{}: the vocabulary is empty", vocab_path);
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    TESSEL_CHECK(it.value().is_number_integer(), kOp, "{}: key {}: the id must be an integer, got {}", vocab_path,
                 quote_token(it.key()), it.value().dump());
    int64_t id = it.value().get<int64_t>();
    TESSEL_CHECK(id >= 0 && id < INT32_MAX, kOp, "{}: key {}: id {} is outside [0, 2^31 - 1)", vocab_path,
                 quote_token(it.key()), id);
    max_id = std::max(max_id, id);
  }
  tok->id_to_token_.assign(size_t(max_id + 1), std::string());
  tok->id_to_bytes_.assign(size_t(max_id + 1), std::string());
  tok->id_used_.assign(size_t(max_id + 1), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string& token = it.key();
    const int32_t id = int32_t(it.value().get<int64_t>());
    TESSEL_CHECK(!token.empty(), kOp, "{}: key '': empty token string (id {})", vocab_path, id);
    TESSEL_CHECK(!tok->id_used_[id], kOp, "{}: key {}: id {} is also used by key {}", vocab_path, quote_token(token),
                 id, quote_token(tok->id_to_token_[id]));
    std::string bytes;
    for (const auto& c : unicode::decode_utf8(token)) {
      TESSEL_CHECK(c.cp < u2b.size() && u2b[c.cp] >= 0, kOp,
                   "{}: key {}: character U+{:04X} is not in GPT-2's bytes-to-unicode table", vocab_path,
                   quote_token(token), c.cp);
      bytes.push_back(char(uint8_t(u2b[c.cp])));
    }
    tok->id_used_[id] = true;
    tok->id_to_token_[id] = token;
    tok->id_to_bytes_[id] = std::move(bytes);
    tok->token_to_id_.emplace(token, id);
  }
  for (int b = 0; b < 256; ++b) {
    TESSEL_CHECK(tok->token_to_id_.count(tok->byte_symbol_[b]), kOp,
                 "{}: the symbol {} for byte 0x{:02x} is missing: a byte-level vocabulary needs all 256", vocab_path,
                 quote_token(tok->byte_symbol_[b]), b);
  }

  // merges.txt: optional "#version" first line, then "left right" per line, by rank.
  const std::string merges_text = read_file(merges_path, kOp);
  size_t pos = 0;
  int64_t line_no = 0;
  int32_t rank = 0;
  while (pos < merges_text.size()) {
    size_t nl = merges_text.find('\n', pos);
    if (nl == std::string::npos) nl = merges_text.size();
    std::string_view line(merges_text.data() + pos, nl - pos);
    pos = nl + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (line_no == 1 && line.substr(0, 8) == "#version") continue;
    const size_t sp = line.find(' ');
    TESSEL_CHECK(sp != std::string_view::npos && sp > 0 && sp + 1 < line.size() &&
                     line.find(' ', sp + 1) == std::string_view::npos,
                 kOp, "{}:{}: malformed merge line {}: expected two tokens separated by one space", merges_path,
                 line_no, quote_token(line));
    const std::string left(line.substr(0, sp)), right(line.substr(sp + 1));
    for (const std::string* part : {&left, &right}) {
      TESSEL_CHECK(tok->token_to_id_.count(*part), kOp,
                   "{}:{}: merge {} uses the token {}, which is not in the vocabulary {}", merges_path, line_no,
                   quote_token(line), quote_token(*part), vocab_path);
    }
    TESSEL_CHECK(tok->token_to_id_.count(left + right), kOp,
                 "{}:{}: merge {} produces the token {}, which is not in the vocabulary {}", merges_path, line_no,
                 quote_token(line), quote_token(left + right), vocab_path);
    const bool fresh = tok->merge_ranks_.emplace(std::string(line), rank).second;
    TESSEL_CHECK(fresh, kOp, "{}:{}: duplicate merge {}", merges_path, line_no, quote_token(line));
    ++rank;
  }
  return tok;
}

// ---- Gpt2BpeTokenizer: encoding --------------------------------------------------

std::vector<std::string> Gpt2BpeTokenizer::bpe(std::string_view pretoken) const {
  std::vector<std::string> word;
  word.reserve(pretoken.size());
  for (unsigned char b : pretoken) word.push_back(byte_symbol_[b]);
  std::string key;
  while (word.size() > 1) {
    // The adjacent pair with the lowest rank.
    int32_t best_rank = INT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < word.size(); ++i) {
      key.assign(word[i]).append(" ").append(word[i + 1]);
      auto it = merge_ranks_.find(key);
      if (it != merge_ranks_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    // Merge every non-overlapping occurrence of that pair, left to right.
    const std::string first = word[best], second = word[best + 1];
    std::vector<std::string> merged;
    merged.reserve(word.size());
    for (size_t i = 0; i < word.size();) {
      if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
        merged.push_back(first + second);
        i += 2;
      } else {
        merged.push_back(std::move(word[i]));
        i += 1;
      }
    }
    word = std::move(merged);
  }
  return word;
}

std::vector<int32_t> Gpt2BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 1);
  for (std::string_view piece : pretokenize(text)) {
    const std::string key(piece);
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      auto it = cache_.find(key);
      if (it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        continue;
      }
    }
    std::vector<int32_t> word_ids;
    for (const std::string& symbol : bpe(piece)) {
      auto it = token_to_id_.find(symbol);
      // Unreachable after load()'s checks (bytes and merge results are in the vocabulary).
      TESSEL_CHECK(it != token_to_id_.end(), kOp, "encode: symbol {} is not in the vocabulary", quote_token(symbol));
      word_ids.push_back(it->second);
    }
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(key, std::move(word_ids));
  }
  return ids;
}

std::string Gpt2BpeTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    TESSEL_CHECK(id >= 0 && size_t(id) < id_used_.size() && id_used_[id], kOp,
                 "decode: id {} at position {} is not in the vocabulary (size {})", id, i, id_used_.size());
    out += id_to_bytes_[id];
  }
  return out;
}

std::optional<int32_t> Gpt2BpeTokenizer::token_id(const std::string& token) const {
  auto it = token_to_id_.find(token);
  if (it == token_to_id_.end()) return std::nullopt;
  return it->second;
}

std::shared_ptr<Tokenizer> make_tokenizer(const std::string& kind, const std::string& path,
                                          const std::string& merges_path) {
  if (kind == "byte") return std::make_shared<ByteTokenizer>();
  if (kind == "gpt2") {
    TESSEL_CHECK(!path.empty() && !merges_path.empty(), "tokenizer",
                 "the gpt2 tokenizer needs a vocab.json and a merges.txt path");
    return Gpt2BpeTokenizer::load(path, merges_path);
  }
  if (kind == "hf") {
    TESSEL_CHECK(!path.empty(), "tokenizer", "the hf tokenizer needs the path of a Hugging Face tokenizer.json");
    return HfTokenizer::load(path);
  }
  TESSEL_FAIL("tokenizer", "unknown tokenizer '{}' (expected 'byte', 'gpt2' or 'hf')", kind);
}

}  // namespace tessel::train
