#include "train/hf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <functional>
#include <queue>

#include "runtime/error.h"
#include "train/atomic_file.h"
#include "train/unicode.h"

namespace tessel::train {

namespace {

using json = nlohmann::json;
constexpr const char* kOp = "hf tokenizer";
constexpr size_t kMaxCacheEntries = size_t(1) << 17;
constexpr size_t kMaxCachedPiece = 256;  // bytes; longer pre-tokens are not cached (as `tokenizers`)

// The two pre-tokenizer regexes tessel implements by hand, as tokenizer.json spells them.
constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr const char* kNormalizers = "Prepend, Replace (String pattern), Sequence of those, or null";
constexpr const char* kPreTokenizers =
    "ByteLevel, Metaspace, Split (GPT-2's or LLaMA-3's regex, behavior Isolated), Sequence of those, or null";
constexpr const char* kDecoders = "ByteLevel, Metaspace, Replace (String pattern), ByteFallback, Fuse, Strip, "
                                  "Sequence of those, or null";
constexpr const char* kProcessors = "TemplateProcessing, ByteLevel, Sequence of those, or null";

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size())
    out.append(s, pos, hit - pos).append(to);
  out.append(s, pos, std::string::npos);
  s = std::move(out);
}

bool starts_with(std::string_view s, std::string_view prefix) { return s.substr(0, prefix.size()) == prefix; }

// "<0xNN>" -> NN, as `tokenizers`' ByteFallback decoder reads it.
std::optional<uint8_t> byte_token_value(std::string_view t) {
  if (t.size() != 6 || !starts_with(t, "<0x") || t[5] != '>') return std::nullopt;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  const int hi = hex(t[3]), lo = hex(t[4]);
  if (hi < 0 || lo < 0) return std::nullopt;
  return uint8_t(hi * 16 + lo);
}

std::string byte_token_name(uint8_t b) { return fmt::format(FMT_STRING("<0x{:02X}>"), b); }

// JSON access with errors that name the file and the JSON path.
struct Reader {
  std::string source;

  [[noreturn]] void fail(const std::string& path, const std::string& what) const {
    TESSEL_FAIL(kOp, "{}: {}: {}", source, path, what);
  }
  static std::string key_path(const std::string& path, const char* key) {
    return path.empty() ? std::string(key) : path + "." + key;
  }
  // The member, or nullptr when absent or null.
  const json* optional(const json& obj, const std::string& path, const char* key) const {
    if (!obj.is_object()) fail(path, fmt::format("expected an object, got {}", obj.type_name()));
    auto it = obj.find(key);
    return it == obj.end() || it->is_null() ? nullptr : &*it;
  }
  const json& required(const json& obj, const std::string& path, const char* key) const {
    const json* v = optional(obj, path, key);
    if (!v) fail(key_path(path, key), "missing");
    return *v;
  }
  std::string string(const json& obj, const std::string& path, const char* key) const {
    const json& v = required(obj, path, key);
    if (!v.is_string()) fail(key_path(path, key), fmt::format("expected a string, got {}", v.dump()));
    return v.get<std::string>();
  }
  std::optional<std::string> optional_string(const json& obj, const std::string& path, const char* key) const {
    if (!optional(obj, path, key)) return std::nullopt;
    return string(obj, path, key);
  }
  bool boolean(const json& obj, const std::string& path, const char* key, bool if_absent) const {
    const json* v = optional(obj, path, key);
    if (!v) return if_absent;
    if (!v->is_boolean()) fail(key_path(path, key), fmt::format("expected true or false, got {}", v->dump()));
    return v->get<bool>();
  }
  int64_t integer(const json& obj, const std::string& path, const char* key, int64_t if_absent) const {
    const json* v = optional(obj, path, key);
    if (!v) return if_absent;
    if (!v->is_number_integer() || v->get<int64_t>() < 0)
      fail(key_path(path, key), fmt::format("expected a non-negative integer, got {}", v->dump()));
    return v->get<int64_t>();
  }
  const json& array(const json& obj, const std::string& path, const char* key) const {
    const json& v = required(obj, path, key);
    if (!v.is_array()) fail(key_path(path, key), fmt::format("expected an array, got {}", v.type_name()));
    return v;
  }
  std::string type(const json& obj, const std::string& path) const { return string(obj, path, "type"); }
  // Calls read(component, path, type) for the component at `key` of `root`
  // (absent or null: never), or for each member of a {"type": "Sequence",
  // list_key: [...]}, nested Sequences included.
  void components(const json& root, const char* key, const char* list_key,
                  const std::function<void(const json&, const std::string&, const std::string&)>& read) const {
    std::function<void(const json&, const std::string&)> walk = [&](const json& c, const std::string& path) {
      const std::string t = type(c, path);
      if (t != "Sequence") return read(c, path, t);
      const json& list = array(c, path, list_key);
      for (size_t i = 0; i < list.size(); ++i) walk(list[i], fmt::format("{}.{}[{}]", path, list_key, i));
    };
    if (const json* c = optional(root, "", key)) walk(*c, key);
  }
  // A {"String": s} pattern (Replace); a {"Regex": ...} one is not supported.
  std::string string_pattern(const json& obj, const std::string& path) const {
    const std::string p = key_path(path, "pattern");
    const json& pat = required(obj, path, "pattern");
    if (const json* s = optional(pat, p, "String")) {
      if (!s->is_string()) fail(p + ".String", "expected a string");
      if (s->get<std::string>().empty()) fail(p + ".String", "an empty pattern");
      return s->get<std::string>();
    }
    if (optional(pat, p, "Regex")) fail(p + ".Regex", "a Regex pattern is not supported here (supported: String)");
    fail(p, fmt::format("expected {{\"String\": ...}}, got {}", pat.dump()));
  }
  // A string of exactly one character (Metaspace's replacement, Strip's content).
  std::string one_char(const json& obj, const std::string& path, const char* key) const {
    std::string s = string(obj, path, key);
    const auto cps = unicode::decode_utf8(s);
    if (cps.size() != 1 || cps[0].cp >= unicode::kInvalidByte)
      fail(key_path(path, key), fmt::format("expected one character, got {}", quote_token(s)));
    return s;
  }
};

enum class Prepend { Always, First, Never };

Prepend metaspace_scheme(const Reader& r, const json& obj, const std::string& path) {
  if (auto s = r.optional_string(obj, path, "prepend_scheme")) {
    Prepend scheme;
    if (*s == "always") scheme = Prepend::Always;
    else if (*s == "first") scheme = Prepend::First;
    else if (*s == "never") scheme = Prepend::Never;
    else r.fail(path + ".prepend_scheme", fmt::format("'{}' is not one of always | first | never", *s));
    if (!r.boolean(obj, path, "add_prefix_space", true) && scheme != Prepend::Never)
      r.fail(path, "add_prefix_space = false does not match prepend_scheme '" + *s + "'");
    return scheme;
  }
  return r.boolean(obj, path, "add_prefix_space", true) ? Prepend::Always : Prepend::Never;
}

struct NormStep {
  bool prepend = false;  // Prepend(from) ; else Replace(from -> to)
  std::string from, to;
};

enum class PreKind { SplitGpt2, SplitLlama3, ByteLevel, Metaspace };
struct PreStep {
  PreKind kind;
  bool add_prefix_space = false, use_regex = true;  // ByteLevel
  std::string replacement;                          // Metaspace
  Prepend scheme = Prepend::Always;
  bool split = true;
};

enum class DecKind { ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip };
struct DecStep {
  DecKind kind;
  std::string from, to;          // Replace; Metaspace: from = replacement; Strip: from = content
  int64_t start = 0, stop = 0;   // Strip
  Prepend scheme = Prepend::Always;
};

struct AddedToken {
  int32_t id = 0;
  std::string content;
  std::string pattern;  // what is matched: the content, normalized when `normalized`
  bool special = false, normalized = false, lstrip = false, rstrip = false;
};

// Byte trie over the added tokens' patterns: the longest pattern starting at a position.
class Trie {
 public:
  Trie() : nodes_(1) {}
  void add(const std::string& pattern, int32_t value) {
    int32_t node = 0;
    for (unsigned char c : pattern) {
      auto it = nodes_[node].next.find(c);
      if (it == nodes_[node].next.end()) {
        nodes_.emplace_back();
        it = nodes_[node].next.emplace(c, int32_t(nodes_.size() - 1)).first;
      }
      node = it->second;
    }
    nodes_[node].value = value;
  }
  bool empty() const { return nodes_.size() == 1; }
  // (value, length) of the longest pattern at s[pos...], value -1 when none.
  std::pair<int32_t, size_t> longest(std::string_view s, size_t pos) const {
    std::pair<int32_t, size_t> best{-1, 0};
    int32_t node = 0;
    for (size_t i = pos; i < s.size(); ++i) {
      auto it = nodes_[node].next.find(static_cast<unsigned char>(s[i]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].value >= 0) best = {nodes_[node].value, i + 1 - pos};
    }
    return best;
  }

 private:
  struct Node {
    std::unordered_map<unsigned char, int32_t> next;
    int32_t value = -1;
  };
  std::vector<Node> nodes_;
};

// A part of the input on its way through the pipeline: text, or an added token's id.
struct Piece {
  std::string text;
  int32_t added_id = -1;
  bool at_start = false;  // begins at offset 0 of the input (Metaspace prepend_scheme "first")
};

}  // namespace

struct HfTokenizer::Impl {
  std::string source;
  std::vector<NormStep> normalizer;
  std::vector<PreStep> pre_tokenizer;
  std::vector<DecStep> decoder;
  bool has_decoder = false;
  std::vector<std::vector<int32_t>> template_before, template_after;  // special ids around $A

  // BPE model
  std::unordered_map<std::string, int32_t> vocab;               // model vocabulary
  std::unordered_map<uint64_t, std::pair<uint32_t, int32_t>> merges;  // (left, right) -> (rank, new id)
  std::optional<int32_t> unk_id;
  bool fuse_unk = false, byte_fallback = false, ignore_merges = false;
  int32_t byte_ids[256] = {};
  std::string byte_symbol[256];  // ByteLevel: UTF-8 of bytes_to_unicode()[b]

  std::vector<AddedToken> added;
  std::unordered_map<std::string, int32_t> added_by_content;  // content -> index in `added`
  std::unordered_map<int32_t, std::string> decode_form;       // added ids whose normalized form differs
  Trie raw_trie, normalized_trie;                             // values: index in `added`

  std::string normalize(std::string s) const {
    for (const NormStep& n : normalizer) {
      if (n.prepend) {
        if (!s.empty()) s = n.from + s;
      } else {
        replace_all(s, n.from, n.to);
      }
    }
    return s;
  }

  // `tokenizers`' AddedVocabulary::find_matches: splits `text` at the added
  // tokens of `trie` (leftmost, then longest), appending to `out`.
  void split_added(const std::string& text, bool at_start, const Trie& trie, bool match_special,
                   std::vector<Piece>& out) const {
    if (text.empty()) return;
    if (trie.empty()) {
      out.push_back({text, -1, at_start});
      return;
    }
    auto ws_before = [&](size_t end) {  // start of the whitespace run ending at `end`
      const auto cps = unicode::decode_utf8(std::string_view(text).substr(0, end));
      size_t k = cps.size();
      while (k > 0 && unicode::is_whitespace(cps[k - 1].cp)) --k;
      return k == cps.size() ? end : size_t(cps[k].offset);
    };
    auto ws_after = [&](size_t begin) {  // end of the whitespace run starting at `begin`
      const auto cps = unicode::decode_utf8(std::string_view(text).substr(begin));
      size_t k = 0;
      while (k < cps.size() && unicode::is_whitespace(cps[k].cp)) ++k;
      return begin + (k == cps.size() ? text.size() - begin : size_t(cps[k].offset));
    };
    size_t start_offset = 0;
    size_t pos = 0;
    while (pos < text.size()) {
      const auto [index, len] = trie.longest(text, pos);
      if (index < 0) {
        ++pos;
        continue;
      }
      const AddedToken& t = added[size_t(index)];
      size_t start = pos, stop = pos + len;
      pos = stop;  // the search goes on after the match itself, as `tokenizers`' iterator
      if (t.special && !match_special) continue;
      if (t.lstrip) start = std::max(ws_before(start), start_offset);
      if (t.rstrip) stop = ws_after(stop);
      if (start_offset < start)
        out.push_back({text.substr(start_offset, start - start_offset), -1, at_start && start_offset == 0});
      out.push_back({"", t.id, false});
      start_offset = stop;
    }
    if (start_offset < text.size())
      out.push_back({text.substr(start_offset), -1, at_start && start_offset == 0});
  }

  // One pre-tokenizer step over the text pieces (added tokens pass through).
  std::vector<Piece> pre_tokenize(const PreStep& step, std::vector<Piece> pieces) const {
    std::vector<Piece> out;
    out.reserve(pieces.size());
    for (Piece& p : pieces) {
      if (p.added_id >= 0) {
        out.push_back(std::move(p));
        continue;
      }
      auto push_views = [&](const std::vector<std::string_view>& views, bool at_start) {
        for (size_t i = 0; i < views.size(); ++i) out.push_back({std::string(views[i]), -1, at_start && i == 0});
      };
      switch (step.kind) {
        case PreKind::SplitGpt2: push_views(pretokenize(p.text), p.at_start); break;
        case PreKind::SplitLlama3: push_views(pretokenize_llama3(p.text), p.at_start); break;
        case PreKind::ByteLevel: {
          std::string text = std::move(p.text);
          if (step.add_prefix_space && !starts_with(text, " ")) text.insert(text.begin(), ' ');
          std::vector<std::string_view> views;
          if (step.use_regex) views = pretokenize(text);
          else views.push_back(text);
          for (size_t i = 0; i < views.size(); ++i) {
            std::string mapped;
            mapped.reserve(views[i].size() * 2);
            for (unsigned char b : views[i]) mapped += byte_symbol[b];
            out.push_back({std::move(mapped), -1, p.at_start && i == 0});
          }
          break;
        }
        case PreKind::Metaspace: {
          std::string text = std::move(p.text);
          replace_all(text, " ", step.replacement);
          const bool prepend = step.scheme == Prepend::Always || (step.scheme == Prepend::First && p.at_start);
          if (prepend && !starts_with(text, step.replacement)) text = step.replacement + text;
          if (!step.split) {
            out.push_back({std::move(text), -1, p.at_start});
            break;
          }
          // Split before every replacement character (MergedWithNext).
          size_t begin = 0;
          for (size_t hit = text.find(step.replacement, 1); hit != std::string::npos;
               hit = text.find(step.replacement, hit + step.replacement.size())) {
            if (hit > begin) out.push_back({text.substr(begin, hit - begin), -1, p.at_start && begin == 0});
            begin = hit;
          }
          if (begin < text.size()) out.push_back({text.substr(begin), -1, p.at_start && begin == 0});
          break;
        }
      }
    }
    return out;
  }

  // `tokenizers`' BPE::merge_word + Word::merge_all.
  std::vector<int32_t> bpe(const std::string& piece) const {
    struct Symbol {
      int32_t c;
      int64_t prev, next;
      size_t len;  // 0: merged into its left neighbour
    };
    std::vector<Symbol> symbols;
    symbols.reserve(piece.size());
    auto add = [&](int32_t c, size_t len) {
      const int64_t n = int64_t(symbols.size());
      if (n > 0) symbols.back().next = n;
      symbols.push_back({c, n - 1, -1, len});
    };
    std::optional<std::pair<int32_t, size_t>> unk;  // pending unknown (id, bytes)
    for (const unicode::CodePoint& c : unicode::decode_utf8(piece)) {
      const std::string_view s = std::string_view(piece).substr(c.offset, c.length);
      auto it = vocab.find(std::string(s));
      if (it != vocab.end()) {
        if (unk) add(unk->first, unk->second), unk.reset();
        add(it->second, c.length);
      } else if (byte_fallback) {  // load() checked that all 256 byte tokens exist
        for (unsigned char b : s) add(byte_ids[b], 1);
      } else if (unk_id) {
        if (unk && fuse_unk) unk->second += c.length;
        else {
          if (unk) add(unk->first, unk->second);
          unk = std::make_pair(*unk_id, size_t(c.length));
        }
      } else {
        TESSEL_FAIL(kOp, "{}: encode: the character {} (U+{:04X}) is not in the vocabulary, and the model has "
                    "neither byte_fallback nor an unk_token",
                    source, quote_token(s), c.cp < unicode::kInvalidByte ? c.cp : c.cp - unicode::kInvalidByte);
      }
    }
    if (unk) add(unk->first, unk->second);

    struct Merge {
      uint32_t rank, pos;
      int32_t new_id;
    };
    // A min-heap on (rank, pos).
    auto later = [](const Merge& a, const Merge& b) { return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos; };
    std::priority_queue<Merge, std::vector<Merge>, decltype(later)> queue(later);
    auto find = [&](int32_t a, int32_t b) -> const std::pair<uint32_t, int32_t>* {
      auto it = merges.find((uint64_t(uint32_t(a)) << 32) | uint32_t(b));
      return it == merges.end() ? nullptr : &it->second;
    };
    for (size_t i = 0; i + 1 < symbols.size(); ++i)
      if (auto m = find(symbols[i].c, symbols[i + 1].c)) queue.push({m->first, uint32_t(i), m->second});
    while (!queue.empty()) {
      const Merge top = queue.top();
      queue.pop();
      Symbol& cur = symbols[top.pos];
      if (cur.len == 0 || cur.next == -1) continue;
      const size_t next_pos = size_t(cur.next);
      const Symbol right = symbols[next_pos];
      // A stale entry: the pair at this position changed since it was queued.
      auto m = find(cur.c, right.c);
      if (!m || m->second != top.new_id) continue;
      cur.c = top.new_id;
      cur.len += right.len;
      cur.next = right.next;
      symbols[next_pos].len = 0;
      if (right.next >= 0 && size_t(right.next) < symbols.size()) symbols[size_t(right.next)].prev = top.pos;
      if (cur.prev >= 0)
        if (auto pm = find(symbols[size_t(cur.prev)].c, cur.c)) queue.push({pm->first, uint32_t(cur.prev), pm->second});
      if (cur.next >= 0)
        if (auto nm = find(cur.c, symbols[size_t(cur.next)].c)) queue.push({nm->first, top.pos, nm->second});
    }
    std::vector<int32_t> ids;
    for (const Symbol& s : symbols)
      if (s.len != 0) ids.push_back(s.c);
    return ids;
  }

  std::vector<std::string> run_decoder(std::vector<std::string> tokens) const;
};

// ---- loading ----------------------------------------------------------------------

HfTokenizer::HfTokenizer() = default;

std::shared_ptr<HfTokenizer> HfTokenizer::load(const std::string& path) {
  return parse(read_file(path, kOp), path);
}

std::shared_ptr<HfTokenizer> HfTokenizer::parse(const std::string& text, const std::string& source) {
  Reader r{source};
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {
    TESSEL_FAIL(kOp, "{}: invalid JSON: {}", source, e.what());
  }
  if (!root.is_object()) r.fail("(top level)", fmt::format("expected a JSON object, got {}", root.type_name()));
  auto impl = std::make_shared<Impl>();
  impl->source = source;
  std::shared_ptr<HfTokenizer> tok(new HfTokenizer());
  const auto& b2u = bytes_to_unicode();
  for (int b = 0; b < 256; ++b) unicode::append_utf8(impl->byte_symbol[b], b2u[b]);

  for (const char* key : {"truncation", "padding"})
    if (r.optional(root, "", key))
      r.fail(key, "not supported (tessel encodes whole texts): it must be null");

  // ---- normalizer
  r.components(root, "normalizer", "normalizers", [&](const json& n, const std::string& path, const std::string& type) {
    if (type == "Prepend") {
      impl->normalizer.push_back({true, r.string(n, path, "prepend"), ""});
    } else if (type == "Replace") {
      impl->normalizer.push_back({false, r.string_pattern(n, path), r.string(n, path, "content")});
    } else {
      r.fail(path + ".type", fmt::format("normalizer '{}' is not supported (supported: {})", type, kNormalizers));
    }
  });

  // ---- pre_tokenizer
  r.components(root, "pre_tokenizer", "pretokenizers", [&](const json& p, const std::string& path,
                                                           const std::string& type) {
    PreStep step{PreKind::ByteLevel};
    if (type == "ByteLevel") {
      step.add_prefix_space = r.boolean(p, path, "add_prefix_space", true);
      step.use_regex = r.boolean(p, path, "use_regex", true);
    } else if (type == "Metaspace") {
      step.kind = PreKind::Metaspace;
      step.replacement = r.one_char(p, path, "replacement");
      step.scheme = metaspace_scheme(r, p, path);
      step.split = r.boolean(p, path, "split", true);
    } else if (type == "Split") {
      const std::string pp = path + ".pattern";
      const json& pat = r.required(p, path, "pattern");
      const json* re = r.optional(pat, pp, "Regex");
      if (!re || !re->is_string())
        r.fail(pp, fmt::format("{} is not supported (supported: {{\"Regex\": GPT-2's or LLaMA-3's pattern}})",
                               pat.dump()));
      const std::string regex = re->get<std::string>();
      if (regex == kLlama3Regex) step.kind = PreKind::SplitLlama3;
      else if (regex == kGpt2Regex) step.kind = PreKind::SplitGpt2;
      else
        r.fail(pp + ".Regex", fmt::format("the pattern {} is not supported: tessel implements two by hand, "
                                          "GPT-2's {} and LLaMA-3's {}",
                                          json(regex).dump(), json(kGpt2Regex).dump(), json(kLlama3Regex).dump()));
      const std::string behavior = r.string(p, path, "behavior");
      if (behavior != "Isolated")
        r.fail(path + ".behavior", fmt::format("'{}' is not supported (supported: Isolated)", behavior));
      if (r.boolean(p, path, "invert", false)) r.fail(path + ".invert", "true is not supported (supported: false)");
    } else {
      r.fail(path + ".type", fmt::format("pre-tokenizer '{}' is not supported (supported: {})", type, kPreTokenizers));
    }
    impl->pre_tokenizer.push_back(step);
  });

  // ---- model
  const json& model = r.required(root, "", "model");
  {
    const json* type = r.optional(model, "model", "type");
    if (type && (!type->is_string() || type->get<std::string>() != "BPE"))
      r.fail("model.type", fmt::format("{} is not supported (supported: BPE)", type->dump()));
    if (!type && !r.optional(model, "model", "merges"))
      r.fail("model", "no type and no merges: only BPE models are supported");
  }
  if (const json* d = r.optional(model, "model", "dropout")) {
    if (!d->is_number() || d->get<double>() != 0.0)
      r.fail("model.dropout", fmt::format("{} is not supported (supported: null or 0; tessel's BPE is deterministic)",
                                          d->dump()));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const json* v = r.optional(model, "model", key); v && !(v->is_string() && v->get<std::string>().empty()))
      r.fail(std::string("model.") + key, fmt::format("{} is not supported (supported: null)", v->dump()));
  }
  impl->fuse_unk = r.boolean(model, "model", "fuse_unk", false);
  impl->byte_fallback = r.boolean(model, "model", "byte_fallback", false);
  impl->ignore_merges = r.boolean(model, "model", "ignore_merges", false);

  const json& vocab = r.required(model, "model", "vocab");
  if (!vocab.is_object())
    r.fail("model.vocab", fmt::format("expected an object (token -> id), got {}", vocab.type_name()));
  if (vocab.empty()) r.fail("model.vocab", "the vocabulary is empty");
  int64_t max_id = -1;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 || it.value().get<int64_t>() >= INT32_MAX)
      r.fail("model.vocab[" + json(it.key()).dump() + "]",
             fmt::format("expected an id in [0, 2^31 - 1), got {}", it.value().dump()));
    max_id = std::max(max_id, it.value().get<int64_t>());
  }
  const json* added_json = r.optional(root, "", "added_tokens");
  if (added_json && !added_json->is_array())
    r.fail("added_tokens", fmt::format("expected an array, got {}", added_json->type_name()));
  if (added_json) {
    for (size_t i = 0; i < added_json->size(); ++i)
      max_id = std::max(max_id, r.integer((*added_json)[i], fmt::format("added_tokens[{}]", i), "id", 0));
  }
  if (max_id >= INT32_MAX) r.fail("added_tokens", "an id is beyond 2^31 - 1");
  tok->id_to_token_.assign(size_t(max_id + 1), std::string());
  tok->id_used_.assign(size_t(max_id + 1), false);
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const int32_t id = int32_t(it.value().get<int64_t>());
    if (tok->id_used_[id])
      r.fail("model.vocab[" + json(it.key()).dump() + "]",
             fmt::format("id {} is also the id of {}", id, json(tok->id_to_token_[id]).dump()));
    if (it.key().empty()) r.fail("model.vocab", fmt::format("an empty token (id {})", id));
    tok->id_used_[id] = true;
    tok->id_to_token_[id] = it.key();
    impl->vocab.emplace(it.key(), id);
  }

  // merges: "a b" strings (the older format) or ["a", "b"] pairs.
  const json& merges = r.array(model, "model", "merges");
  uint32_t rank = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::string path = fmt::format("model.merges[{}]", i);
    const json& m = merges[i];
    std::string left, right;
    if (m.is_string()) {
      const std::string line = m.get<std::string>();
      if (starts_with(line, "#version")) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos)
        r.fail(path, fmt::format("{} is not two tokens separated by one space", json(line).dump()));
      left = line.substr(0, sp);
      right = line.substr(sp + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      r.fail(path, fmt::format("expected \"left right\" or [\"left\", \"right\"], got {}", m.dump()));
    }
    int32_t ids[2];
    for (int k = 0; k < 2; ++k) {
      const std::string& part = k == 0 ? left : right;
      auto it = impl->vocab.find(part);
      if (it == impl->vocab.end())
        r.fail(path, fmt::format("the token {} is not in model.vocab", json(part).dump()));
      ids[k] = it->second;
    }
    auto res = impl->vocab.find(left + right);
    if (res == impl->vocab.end())
      r.fail(path, fmt::format("the merge result {} is not in model.vocab", json(left + right).dump()));
    const uint64_t key = (uint64_t(uint32_t(ids[0])) << 32) | uint32_t(ids[1]);
    if (!impl->merges.emplace(key, std::make_pair(rank, res->second)).second)
      r.fail(path, fmt::format("duplicate merge [{}, {}]", json(left).dump(), json(right).dump()));
    ++rank;
  }
  tok->num_merges_ = int64_t(rank);

  if (auto unk = r.optional_string(model, "model", "unk_token")) {
    auto it = impl->vocab.find(*unk);
    if (it == impl->vocab.end()) r.fail("model.unk_token", fmt::format("{} is not in model.vocab", json(*unk).dump()));
    impl->unk_id = it->second;
  }
  if (impl->byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      auto it = impl->vocab.find(byte_token_name(uint8_t(b)));
      if (it == impl->vocab.end())
        r.fail("model.byte_fallback", fmt::format("true, but the byte token {} is not in model.vocab (all 256 "
                                                  "<0x00>..<0xFF> are needed)", byte_token_name(uint8_t(b))));
      impl->byte_ids[b] = it->second;
    }
  }

  // ---- added tokens: ids as `tokenizers` gives them (a token of the model
  // vocabulary keeps its id; the others follow the model vocabulary in order).
  if (added_json) {
    int64_t next_id = int64_t(impl->vocab.size());
    for (size_t i = 0; i < added_json->size(); ++i) {
      const std::string path = fmt::format("added_tokens[{}]", i);
      const json& a = (*added_json)[i];
      AddedToken t;
      const json& idv = r.required(a, path, "id");
      if (!idv.is_number_integer()) r.fail(path + ".id", fmt::format("expected an integer, got {}", idv.dump()));
      t.id = int32_t(idv.get<int64_t>());
      t.content = r.string(a, path, "content");
      if (t.content.empty()) r.fail(path + ".content", "an empty token");
      t.special = r.boolean(a, path, "special", false);
      t.normalized = r.boolean(a, path, "normalized", !t.special);
      t.lstrip = r.boolean(a, path, "lstrip", false);
      t.rstrip = r.boolean(a, path, "rstrip", false);
      if (r.boolean(a, path, "single_word", false))
        r.fail(path + ".single_word", "true is not supported (supported: false)");
      if (impl->added_by_content.count(t.content))
        r.fail(path + ".content", fmt::format("{} is already added_tokens[{}]", json(t.content).dump(),
                                              impl->added_by_content[t.content]));
      auto in_vocab = impl->vocab.find(t.content);
      if (in_vocab != impl->vocab.end()) {
        if (in_vocab->second != t.id)
          r.fail(path + ".id", fmt::format("{}, but model.vocab gives {} the id {}", t.id, json(t.content).dump(),
                                           in_vocab->second));
      } else {
        if (tok->id_used_[t.id])
          r.fail(path + ".id", fmt::format("{} is also the id of {}", t.id, json(tok->id_to_token_[t.id]).dump()));
        if (t.id != next_id)
          r.fail(path + ".id", fmt::format("{}, but `tokenizers` numbers the added tokens that are not in "
                                           "model.vocab from the vocabulary's size on, in order: this one gets {}",
                                           t.id, next_id));
        ++next_id;
        tok->id_used_[t.id] = true;
        tok->id_to_token_[t.id] = t.content;
      }
      t.pattern = t.normalized ? impl->normalize(t.content) : t.content;
      if (t.pattern != t.content) impl->decode_form[t.id] = t.pattern;
      impl->added_by_content[t.content] = int32_t(i);
      impl->added.push_back(t);
    }
    for (size_t i = 0; i < impl->added.size(); ++i) {
      const AddedToken& t = impl->added[i];
      (t.normalized ? impl->normalized_trie : impl->raw_trie).add(t.pattern, int32_t(i));
    }
  }

  // ---- post_processor
  bool have_template = false;
  r.components(root, "post_processor", "processors", [&](const json& p, const std::string& path,
                                                        const std::string& type) {
    if (type == "ByteLevel") {
      // Offsets only: no ids.
    } else if (type == "TemplateProcessing") {
      if (have_template) r.fail(path, "a second TemplateProcessing (supported: one)");
      have_template = true;
      const json& specials = r.required(p, path, "special_tokens");
      const json& single = r.array(p, path, "single");
      bool seen_a = false;
      for (size_t i = 0; i < single.size(); ++i) {
        const std::string ip = fmt::format("{}.single[{}]", path, i);
        if (const json* seq = r.optional(single[i], ip, "Sequence")) {
          const std::string which = r.string(*seq, ip + ".Sequence", "id");
          if (which != "A" || seen_a)
            r.fail(ip + ".Sequence.id", fmt::format("'{}': a single-sequence template has one sequence, A", which));
          seen_a = true;
        } else if (const json* sp = r.optional(single[i], ip, "SpecialToken")) {
          const std::string name = r.string(*sp, ip + ".SpecialToken", "id");
          const json* entry = r.optional(specials, path + ".special_tokens", name.c_str());
          if (!entry)
            r.fail(path + ".special_tokens", fmt::format("{} is used by {} but not defined", json(name).dump(), ip));
          const std::string ep = path + ".special_tokens[" + json(name).dump() + "]";
          const json& ids = r.array(*entry, ep, "ids");
          std::vector<int32_t> v;
          for (size_t k = 0; k < ids.size(); ++k) {
            if (!ids[k].is_number_integer() || ids[k].get<int64_t>() < 0 ||
                ids[k].get<int64_t>() >= int64_t(tok->id_used_.size()) || !tok->id_used_[ids[k].get<int64_t>()])
              r.fail(fmt::format("{}.ids[{}]", ep, k),
                     fmt::format("{} is not an id of the vocabulary (size {})", ids[k].dump(), tok->id_used_.size()));
            v.push_back(int32_t(ids[k].get<int64_t>()));
          }
          (seen_a ? impl->template_after : impl->template_before).push_back(std::move(v));
        } else {
          r.fail(ip, fmt::format("expected {{\"Sequence\": ...}} or {{\"SpecialToken\": ...}}, got {}",
                                 single[i].dump()));
        }
      }
      if (!seen_a) r.fail(path + ".single", "the template has no sequence A");
    } else {
      r.fail(path + ".type", fmt::format("post-processor '{}' is not supported (supported: {})", type, kProcessors));
    }
  });
  auto lone = [](const std::vector<std::vector<int32_t>>& pieces) -> std::optional<int32_t> {
    if (pieces.size() == 1 && pieces[0].size() == 1) return pieces[0][0];
    return std::nullopt;
  };
  tok->bos_ = lone(impl->template_before);
  tok->eos_ = lone(impl->template_after);

  // ---- decoder
  impl->has_decoder = r.optional(root, "", "decoder") != nullptr;
  r.components(root, "decoder", "decoders", [&](const json& d, const std::string& path, const std::string& type) {
    DecStep step{DecKind::ByteLevel};
    if (type == "ByteLevel") {
    } else if (type == "Metaspace") {
      step.kind = DecKind::Metaspace;
      step.from = r.one_char(d, path, "replacement");
      step.scheme = metaspace_scheme(r, d, path);
    } else if (type == "Replace") {
      step.kind = DecKind::Replace;
      step.from = r.string_pattern(d, path);
      step.to = r.string(d, path, "content");
    } else if (type == "ByteFallback") {
      step.kind = DecKind::ByteFallback;
    } else if (type == "Fuse") {
      step.kind = DecKind::Fuse;
    } else if (type == "Strip") {
      step.kind = DecKind::Strip;
      step.from = r.one_char(d, path, "content");
      step.start = r.integer(d, path, "start", 0);
      step.stop = r.integer(d, path, "stop", 0);
    } else {
      r.fail(path + ".type", fmt::format("decoder '{}' is not supported (supported: {})", type, kDecoders));
    }
    impl->decoder.push_back(step);
  });

  tok->impl_ = std::move(impl);
  return tok;
}

void HfTokenizer::set_bos_eos(const std::string& bos_token, const std::string& eos_token) {
  for (auto [content, slot] : {std::pair{&bos_token, &bos_}, std::pair{&eos_token, &eos_}}) {
    if (content->empty()) continue;
    auto id = token_id(*content);
    TESSEL_CHECK(id.has_value(), kOp, "{}: {} is not a token of this tokenizer", impl_->source, quote_token(*content));
    *slot = *id;
  }
}

// ---- encoding ---------------------------------------------------------------------

std::vector<int32_t> HfTokenizer::encode(std::string_view text) const { return encode(text, HfEncodeOptions{}); }

std::vector<int32_t> HfTokenizer::bpe_piece(const std::string& piece) const {
  const Impl& im = *impl_;
  if (im.ignore_merges) {
    auto it = im.vocab.find(piece);
    if (it != im.vocab.end()) return {it->second};
  }
  const bool cacheable = piece.size() < kMaxCachedPiece;
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = cache_.find(piece);
    if (it != cache_.end()) return it->second;
  }
  std::vector<int32_t> ids = im.bpe(piece);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    if (cache_.size() >= kMaxCacheEntries) cache_.clear();
    cache_.emplace(piece, ids);
  }
  return ids;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, const HfEncodeOptions& options) const {
  const Impl& im = *impl_;
  // 1. Added tokens in the raw text; 2. normalize the rest, then added tokens in the normalized text.
  std::vector<Piece> raw, pieces;
  im.split_added(std::string(text), true, im.raw_trie, options.match_special_tokens, raw);
  for (Piece& p : raw) {
    if (p.added_id >= 0) pieces.push_back(std::move(p));
    else im.split_added(im.normalize(std::move(p.text)), p.at_start, im.normalized_trie, options.match_special_tokens,
                        pieces);
  }
  // 3. Pre-tokenize.
  for (const PreStep& step : im.pre_tokenizer) pieces = im.pre_tokenize(step, std::move(pieces));
  // 4. BPE; 5. the template.
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  if (options.add_special_tokens)
    for (const auto& v : im.template_before) ids.insert(ids.end(), v.begin(), v.end());
  for (const Piece& p : pieces) {
    if (p.added_id >= 0) {
      ids.push_back(p.added_id);
    } else if (!p.text.empty()) {
      const std::vector<int32_t> word = bpe_piece(p.text);
      ids.insert(ids.end(), word.begin(), word.end());
    }
  }
  if (options.add_special_tokens)
    for (const auto& v : im.template_after) ids.insert(ids.end(), v.begin(), v.end());
  return ids;
}

// ---- decoding ---------------------------------------------------------------------

std::vector<std::string> HfTokenizer::Impl::run_decoder(std::vector<std::string> tokens) const {
  static const std::vector<int> unicode_to_byte = [] {
    std::vector<int> t(512, -1);
    const auto& b2u = bytes_to_unicode();
    for (int b = 0; b < 256; ++b) t[b2u[b]] = b;
    return t;
  }();
  for (const DecStep& d : decoder) {
    std::vector<std::string> out;
    switch (d.kind) {
      case DecKind::ByteLevel: {
        // Each token's characters back to bytes; a token with a character
        // outside the table (an added token) stays as it is.
        std::string bytes;
        for (const std::string& t : tokens) {
          std::string tb;
          bool ok = true;
          for (const auto& c : unicode::decode_utf8(t)) {
            if (c.cp >= unicode_to_byte.size() || unicode_to_byte[c.cp] < 0) {
              ok = false;
              break;
            }
            tb.push_back(char(uint8_t(unicode_to_byte[c.cp])));
          }
          bytes += ok ? tb : t;
        }
        out.push_back(std::move(bytes));
        break;
      }
      case DecKind::Metaspace:
        for (size_t i = 0; i < tokens.size(); ++i) {
          std::string t = tokens[i];
          replace_all(t, d.from, i == 0 && d.scheme != Prepend::Never ? "" : " ");
          out.push_back(std::move(t));
        }
        break;
      case DecKind::Replace:
        for (std::string& t : tokens) {
          replace_all(t, d.from, d.to);
          out.push_back(std::move(t));
        }
        break;
      case DecKind::ByteFallback: {
        // Runs of <0xNN> tokens become their bytes (kept as they are when not valid UTF-8).
        std::string run;
        bool in_run = false;
        for (std::string& t : tokens) {
          if (auto b = byte_token_value(t)) {
            run.push_back(char(*b));
            in_run = true;
            continue;
          }
          if (in_run) out.push_back(std::move(run)), run.clear(), in_run = false;
          out.push_back(std::move(t));
        }
        if (in_run) out.push_back(std::move(run));
        break;
      }
      case DecKind::Fuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        out.push_back(std::move(all));
        break;
      }
      case DecKind::Strip:
        for (std::string& t : tokens) {
          size_t begin = 0, end = t.size();
          for (int64_t k = 0; k < d.start && t.compare(begin, d.from.size(), d.from) == 0 && begin < end; ++k)
            begin += d.from.size();
          for (int64_t k = 0; k < d.stop && end >= begin + d.from.size() &&
                              t.compare(end - d.from.size(), d.from.size(), d.from) == 0;
               ++k)
            end -= d.from.size();
          out.push_back(t.substr(begin, end - begin));
        }
        break;
    }
    tokens = std::move(out);
  }
  return tokens;
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& im = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    const int32_t id = ids[i];
    TESSEL_CHECK(id >= 0 && size_t(id) < id_used_.size() && id_used_[id], kOp,
                 "{}: decode: id {} at position {} is not in the vocabulary (size {})", im.source, id, i,
                 id_used_.size());
    auto form = im.decode_form.find(id);
    tokens.push_back(form != im.decode_form.end() ? form->second : id_to_token_[id]);
  }
  std::string out;
  if (!im.has_decoder) {
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const std::string& t : im.run_decoder(std::move(tokens))) out += t;
  return out;
}

std::optional<int32_t> HfTokenizer::token_id(const std::string& token) const {
  auto a = impl_->added_by_content.find(token);
  if (a != impl_->added_by_content.end()) return impl_->added[size_t(a->second)].id;
  auto it = impl_->vocab.find(token);
  if (it == impl_->vocab.end()) return std::nullopt;
  return it->second;
}

const std::string& HfTokenizer::id_to_token(int32_t id) const {
  TESSEL_CHECK(id >= 0 && size_t(id) < id_used_.size() && id_used_[id], kOp,
               "{}: id {} is not in the vocabulary (size {})", impl_->source, id, id_used_.size());
  return id_to_token_[id];
}

// ---- a model folder -----------------------------------------------------------------

std::shared_ptr<Tokenizer> load_tokenizer_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  TESSEL_CHECK(fs::is_directory(dir, ec), kOp, "'{}' is not a folder", dir);
  const std::string json_path = (fs::path(dir) / "tokenizer.json").string();
  if (!fs::exists(json_path, ec)) return nullptr;
  auto tok = HfTokenizer::load(json_path);
  const std::string config_path = (fs::path(dir) / "tokenizer_config.json").string();
  if (fs::exists(config_path, ec)) {
    json config;
    try {
      config = json::parse(read_file(config_path, kOp));
    } catch (const json::exception& e) {
      TESSEL_FAIL(kOp, "{}: invalid JSON: {}", config_path, e.what());
    }
    Reader r{config_path};
    if (!config.is_object()) r.fail("(top level)", fmt::format("expected a JSON object, got {}", config.type_name()));
    std::string names[2];
    const char* keys[2] = {"bos_token", "eos_token"};
    for (int k = 0; k < 2; ++k) {
      const json* v = r.optional(config, "", keys[k]);
      if (!v) continue;
      if (v->is_string()) names[k] = v->get<std::string>();
      else if (v->is_object()) names[k] = r.string(*v, keys[k], "content");  // {"content": "<s>", ...}
      else r.fail(keys[k], fmt::format("expected a string or an object with \"content\", got {}", v->dump()));
      if (!names[k].empty() && !tok->token_id(names[k]))
        r.fail(keys[k], fmt::format("{} is not a token of {}", json(names[k]).dump(), json_path));
    }
    tok->set_bos_eos(names[0], names[1]);
  }
  return tok;
}

}  // namespace tessel::train
