// HfTokenizer (Hugging Face tokenizer.json): small hand-made files written by
// the test, with ids derived by hand from the merge ranks: byte-level BPE the
// GPT-2 way (ByteLevel pre-tokenizer) and the LLaMA-3 way (Split + ByteLevel,
// ignore_merges, a BOS template), SentencePiece-style BPE the LLaMA-2 way
// (Prepend/Replace normalizer, byte fallback, the Replace/ByteFallback/Fuse/
// Strip decoder) and the older Metaspace way, special tokens, unk tokens,
// round trips, the LLaMA-3 pre-tokenizer, a model folder, and every bad-input
// error. The same code runs against PyPI's `tokenizers` in
// `./tessel conformance --tokenizers`.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "test/util/error_of.h"
#include "test/util/runfiles.h"
#include "train/hf_tokenizer.h"
#include "train/tokenizer.h"

using namespace tessel;
using namespace tessel::train;
using tessel::testing::error_of;
using json = nlohmann::ordered_json;
using Ids = std::vector<int32_t>;
using Pieces = std::vector<std::string>;

namespace {

std::string scratch() {
  static const std::string dir = tessel::testing::scratch_dir("tokenizer_json");
  return dir;
}

std::string write_file(const std::string& name, const std::string& content) {
  const std::string path = scratch() + "/" + name;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80)
    s.push_back(char(cp));
  else if (cp < 0x800)
    s += {char(0xC0 | (cp >> 6)), char(0x80 | (cp & 0x3F))};
  else
    s += {char(0xE0 | (cp >> 12)), char(0x80 | ((cp >> 6) & 0x3F)), char(0x80 | (cp & 0x3F))};
  return s;
}

// GPT-2's spelling of a byte string (bytes_to_unicode()).
std::string bl(std::string_view bytes) {
  std::string s;
  for (unsigned char b : bytes) s += utf8(bytes_to_unicode()[b]);
  return s;
}

json added_token(int id, const std::string& content, bool special, bool normalized) {
  return {{"id", id},        {"content", content},       {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", normalized}, {"special", special}};
}

json bpe_model(const json& vocab, const json& merges) {
  return {{"type", "BPE"},
          {"dropout", nullptr},
          {"unk_token", nullptr},
          {"continuing_subword_prefix", nullptr},
          {"end_of_word_suffix", nullptr},
          {"fuse_unk", false},
          {"byte_fallback", false},
          {"ignore_merges", false},
          {"vocab", vocab},
          {"merges", merges}};
}

// Byte-level vocabulary: byte b's symbol has id b; then
//   256 "he", 257 "ll", 258 "hell", 259 "hello", 260 "Ġw", 261 "Ġworld" (no merge makes it);
// merges by rank: h e, l l, he ll, hell o, Ġ w. Added: 262 <|endoftext|>.
json gpt2_file() {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[bl(std::string(1, char(b)))] = b;
  vocab["he"] = 256;
  vocab["ll"] = 257;
  vocab["hell"] = 258;
  vocab["hello"] = 259;
  vocab[bl(" w")] = 260;
  vocab[bl(" world")] = 261;
  json merges = json::array({"h e", "l l", "he ll", "hell o", bl(" ") + " w"});
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array({added_token(262, "<|endoftext|>", true, true)})},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}}},
          {"post_processor",
           {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}}},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model", bpe_model(vocab, merges)}};
}

const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// The same vocabulary the LLaMA-3 way: merges as pairs, ignore_merges, Split +
// ByteLevel, <|begin_of_text|> (262) prepended by the template, <|end_of_text|> 263.
json llama3_file() {
  json f = gpt2_file();
  json merges = json::array();
  for (const auto& m : f["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    merges.push_back({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  f["model"]["merges"] = merges;
  f["model"]["ignore_merges"] = true;
  f["added_tokens"] = json::array(
      {added_token(262, "<|begin_of_text|>", true, false), added_token(263, "<|end_of_text|>", true, false)});
  f["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       json::array(
           {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Regex}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
  f["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       json::array({{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}},
                    {{"type", "TemplateProcessing"},
                     {"single", json::array({{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}},
                                             {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                     {"pair", json::array()},
                     {"special_tokens",
                      {{"<|begin_of_text|>",
                        {{"id", "<|begin_of_text|>"}, {"ids", {262}}, {"tokens", {"<|begin_of_text|>"}}}}}}}})}};
  return f;
}

const std::string kMeta = "\xE2\x96\x81";  // ▁

// SentencePiece-style, as LLaMA-2's file: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258,
// then ▁ 259, h 260, e 261, l 262, o 263, w 264, r 265, d 266,
// ▁h 267, ll 268, ▁he 269, ▁hell 270, ▁hello 271, ▁w 272;
// merges by rank: ▁ h, l l, ▁h e, ▁he ll, ▁hell o, ▁ w.
json llama2_file() {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  int id = 259;
  for (std::string t : {kMeta, std::string("h"), std::string("e"), std::string("l"), std::string("o"), std::string("w"),
                        std::string("r"), std::string("d"), kMeta + "h", std::string("ll"), kMeta + "he",
                        kMeta + "hell", kMeta + "hello", kMeta + "w"})
    vocab[t] = id++;
  json merges = json::array({kMeta + " h", "l l", kMeta + "h e", kMeta + "he ll", kMeta + "hell o", kMeta + " w"});
  json model = bpe_model(vocab, merges);
  model["unk_token"] = "<unk>";
  model["fuse_unk"] = true;
  model["byte_fallback"] = true;
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array({added_token(0, "<unk>", true, false), added_token(1, "<s>", true, false),
                                        added_token(2, "</s>", true, false)})},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers", json::array({{{"type", "Prepend"}, {"prepend", kMeta}},
                                         {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kMeta}}})}}},
          {"pre_tokenizer", nullptr},
          {"post_processor",
           {{"type", "TemplateProcessing"},
            {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                    {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
            {"pair", json::array()},
            {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}}}}}},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", kMeta}}}, {"content", " "}},
                                      {{"type", "ByteFallback"}},
                                      {{"type", "Fuse"}},
                                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
          {"model", model}};
}

std::shared_ptr<HfTokenizer> from(const json& f, const std::string& name = "test.json") {
  return HfTokenizer::parse(f.dump(), name);
}

// The error of a file edited by `edit`.
std::string load_error(json f, const std::function<void(json&)>& edit) {
  edit(f);
  const std::string path = write_file("bad/tokenizer.json", f.dump());
  return error_of([&] { HfTokenizer::load(path); });
}

Pieces split3(std::string_view text) {
  Pieces out;
  for (auto p : pretokenize_llama3(text)) out.emplace_back(p);
  return out;
}

}  // namespace

TEST_CASE("quote_token and the default bos_id / eos_id", "[tokenizer][hf]") {
  CHECK(quote_token("a b") == "'a b'");
  CHECK(quote_token("x\n\x7f") == "'x\\x0a\\x7f'");
  ByteTokenizer byte;
  CHECK_FALSE(byte.bos_id().has_value());
  CHECK_FALSE(byte.eos_id().has_value());
}

TEST_CASE("pretokenize_llama3 follows LLaMA-3's regex", "[tokenizer][hf]") {
  CHECK(split3("") == Pieces{});
  CHECK(split3("Hello world") == Pieces{"Hello", " world"});
  CHECK(split3("I'm here, don't") == Pieces{"I", "'m", " here", ",", " don", "'t"});
  CHECK(split3("I'M WE'LL they'Re") == Pieces{"I", "'M", " WE", "'LL", " they", "'Re"});  // (?i:...)
  CHECK(split3("x'\xC5\xBFt") == Pieces{"x", "'\xC5\xBF", "t"});                          // 'ſ: ſ case-folds to s
  CHECK(split3("'hello") == Pieces{"'hello"});                                            // [^\r\n\p{L}\p{N}]?\p{L}+
  CHECK(split3("(hello)") == Pieces{"(hello", ")"});
  CHECK(split3("\tword") == Pieces{"\tword"});
  CHECK(split3("12345 1234567") == Pieces{"123", "45", " ", "123", "456", "7"});  // \p{N}{1,3}, no space before
  CHECK(split3("\xE2\x82\xAC"
               "100") == Pieces{"\xE2\x82\xAC", "100"});
  CHECK(split3("hi!!\n\nthere") == Pieces{"hi", "!!\n\n", "there"});  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  CHECK(split3("a .\r\nb") == Pieces{"a", " .\r\n", "b"});
  CHECK(split3("x\r\ny") == Pieces{"x", "\r\n", "y"});      // \s*[\r\n]+
  CHECK(split3("a \n\n b") == Pieces{"a", " \n\n", " b"});  // up to the last newline of the run
  CHECK(split3("a \n \t1") == Pieces{"a", " \n", " ", "\t", "1"});
  CHECK(split3("a   b") == Pieces{"a", "  ", " b"});  // \s+(?!\S)
  CHECK(split3("end  ") == Pieces{"end", "  "});
  CHECK(split3("\r\rhello") == Pieces{"\r\r", "hello"});              // CR does not prefix a word
  CHECK(split3("\xF0\x9F\x98\x80!") == Pieces{"\xF0\x9F\x98\x80!"});  // emoji and '!' are both "other"
  std::string cat;
  const std::string text = "Mixed: caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC 42\xC2\xB2 \xFF\xFE  \r\n\tend's";
  for (auto p : pretokenize_llama3(text)) cat += std::string(p);
  CHECK(cat == text);  // the pieces cover the text, invalid UTF-8 included
}

TEST_CASE("byte-level BPE, GPT-2 style: hand-derived ids", "[tokenizer][hf]") {
  auto tok = from(gpt2_file());
  CHECK(tok->name() == "hf-bpe");
  CHECK(tok->vocab_size() == 263);
  CHECK(tok->num_merges() == 5);
  CHECK_FALSE(tok->bos_id().has_value());
  CHECK_FALSE(tok->eos_id().has_value());
  CHECK(tok->token_id("<|endoftext|>") == 262);
  CHECK(tok->token_id(bl(" world")) == 261);
  CHECK_FALSE(tok->token_id("nope").has_value());
  CHECK(tok->id_to_token(259) == "hello");
  CHECK(tok->id_to_token(262) == "<|endoftext|>");
  CHECK_THROWS_WITH(tok->id_to_token(263), Catch::Contains("id 263 is not in the vocabulary (size 263)"));

  // "hello" -> he ll -> hell -> hello; " world": Ġw then single bytes (no ignore_merges).
  CHECK(tok->encode("hello world") == Ids{259, 260, 'o', 'r', 'l', 'd'});
  CHECK(tok->encode("") == Ids{});
  CHECK(tok->encode("hellohello") == Ids{259, 259});
  CHECK(tok->encode("  hello") == Ids{' ', ' ', 259});  // " ", " hello": Ġ stays apart (no "Ġ h" merge)
  // The special token is matched in the text before pre-tokenization.
  CHECK(tok->encode("hello<|endoftext|> world") == Ids{259, 262, 260, 'o', 'r', 'l', 'd'});
  // ... unless special tokens are encoded as text.
  HfEncodeOptions plain;
  plain.match_special_tokens = false;
  CHECK(tok->encode("a<|endoftext|>", plain) ==
        Ids{'a', '<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>'});
  // Decoding: bytes back; the special token as its text.
  CHECK(tok->decode({259, 262, 260, 'o', 'r', 'l', 'd'}) == "hello<|endoftext|> world");
  // Non-ASCII: the UTF-8 bytes of é (C3 A9) are two byte symbols.
  CHECK(tok->encode("\xC3\xA9") == Ids{0xC3, 0xA9});
  // A decode cut inside a character gives the bytes as they are.
  CHECK(tok->decode({0xC3}) == "\xC3");
  // Round trips, invalid UTF-8 included.
  for (std::string text : {std::string("Hello, world!\n\n  It's 2024: caf\xC3\xA9 \xF0\x9F\x98\x80\r\n"),
                           std::string("\xFF\xFE broken \xC3"), std::string(" hello world ")}) {
    INFO(text);
    CHECK(tok->decode(tok->encode(text)) == text);
  }
  // add_prefix_space: a space before each piece that does not start with one.
  json f = gpt2_file();
  f["pre_tokenizer"]["add_prefix_space"] = true;
  auto spaced = from(f);
  CHECK(spaced->encode("hello world") == Ids{' ', 259, 260, 'o', 'r', 'l', 'd'});
  CHECK(spaced->encode("") == Ids{});
  CHECK(spaced->decode(spaced->encode("hello")) == " hello");
}

TEST_CASE("byte-level BPE, LLaMA-3 style: Split regex, ignore_merges, BOS", "[tokenizer][hf]") {
  auto tok = from(llama3_file());
  CHECK(tok->vocab_size() == 264);
  CHECK(tok->bos_id() == 262);
  CHECK_FALSE(tok->eos_id().has_value());
  // ignore_merges: " world" is in the vocabulary as a whole, so it is one token.
  CHECK(tok->encode("hello world") == Ids{262, 259, 261});
  HfEncodeOptions no_bos;
  no_bos.add_special_tokens = false;
  CHECK(tok->encode("hello world", no_bos) == Ids{259, 261});
  CHECK(tok->encode("") == Ids{262});
  CHECK(tok->encode("", no_bos) == Ids{});
  // Numbers split in threes, the space before a number stands alone.
  CHECK(tok->encode("1234 5", no_bos) == Ids{'1', '2', '3', '4', ' ', '5'});
  CHECK(tok->encode("hello<|end_of_text|>", no_bos) == Ids{259, 263});
  CHECK(tok->decode({262, 259, 261, 263}) == "<|begin_of_text|>hello world<|end_of_text|>");
  for (std::string text : {std::string("Hello, WORLD's 12345 \xE2\x82\xAC\r\n\r\n\ttabs  and  spaces \xF0\x9F\x98\x80"),
                           std::string("\xC0\xAF invalid")}) {
    INFO(text);
    CHECK(tok->decode(tok->encode(text, no_bos)) == text);
  }
  // Without ignore_merges " world" goes through the merges.
  json f = llama3_file();
  f["model"]["ignore_merges"] = false;
  CHECK(from(f)->encode("hello world", no_bos) == Ids{259, 260, 'o', 'r', 'l', 'd'});
}

TEST_CASE("SentencePiece-style BPE, LLaMA-2 style: normalizer, byte fallback, decoder", "[tokenizer][hf]") {
  auto tok = from(llama2_file());
  CHECK(tok->vocab_size() == 273);
  CHECK(tok->bos_id() == 1);
  tok->set_bos_eos("", "</s>");
  CHECK(tok->bos_id() == 1);
  CHECK(tok->eos_id() == 2);
  CHECK_THROWS_WITH(tok->set_bos_eos("<bos>", ""), Catch::Contains("'<bos>' is not a token"));
  // "▁hello▁world" is one word: ▁h, ll, ▁he, ▁hell, ▁hello; ▁w; o r l d.
  CHECK(tok->encode("hello world") == Ids{1, 271, 272, 263, 265, 262, 266});
  HfEncodeOptions no_bos;
  no_bos.add_special_tokens = false;
  CHECK(tok->encode("hello world", no_bos) == Ids{271, 272, 263, 265, 262, 266});
  CHECK(tok->encode("") == Ids{1});
  // Byte fallback: i is not in the vocabulary (<0x69>), nor € (E2 82 AC).
  const Ids hi_euro{1, 267, 3 + 0x69, 3 + 0xE2, 3 + 0x82, 3 + 0xAC};
  CHECK(tok->encode("hi\xE2\x82\xAC") == hi_euro);
  // Decoding keeps <s> (skip_special_tokens=False), so Strip finds no leading space.
  CHECK(tok->decode(hi_euro) == "<s> hi\xE2\x82\xAC");
  CHECK(tok->decode({267, 3 + 0x69}) == "hi");
  // Special tokens split the text; each part gets its own ▁ (Prepend).
  CHECK(tok->encode("hello</s>world") == Ids{1, 271, 2, 272, 263, 265, 262, 266});
  HfEncodeOptions plain = no_bos;
  plain.match_special_tokens = false;
  CHECK(tok->encode("</s>", plain) == Ids{259, 3 + '<', 3 + '/', 3 + 's', 3 + '>'});
  // Lone bytes of a cut character decode to themselves.
  CHECK(tok->decode({3 + 0xE2}) == "\xE2");
  for (std::string text : {std::string("hello  world\n\ttab \xF0\x9F\x98\x80 caf\xC3\xA9"), std::string(" lead"),
                           std::string("\xFF raw")}) {
    INFO(text);
    CHECK(tok->decode(tok->encode(text, no_bos)) == text);
  }
  // Without byte fallback: unknown characters become <unk>, fused when fuse_unk.
  json f = llama2_file();
  f["model"]["byte_fallback"] = false;
  CHECK(from(f)->encode("hi\xE2\x82\xAC"
                        "e",
                        no_bos) == Ids{267, 0, 261});
  f["model"]["fuse_unk"] = false;
  CHECK(from(f)->encode("hi\xE2\x82\xAC"
                        "e",
                        no_bos) == Ids{267, 0, 0, 261});
  // Neither byte fallback nor unk: an error naming the character (`tokenizers` would drop it).
  f["model"]["unk_token"] = nullptr;
  CHECK_THAT(error_of([&] { from(f)->encode("hi"); }),
             Catch::Contains("the character 'i' (U+0069) is not in the vocabulary") &&
                 Catch::Contains("neither byte_fallback nor an unk_token"));
}

TEST_CASE("SentencePiece-style BPE, the older Metaspace form", "[tokenizer][hf]") {
  json f = llama2_file();
  f["normalizer"] = nullptr;
  f["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMeta}, {"add_prefix_space", true}};
  f["decoder"] = {{"type", "Metaspace"}, {"replacement", kMeta}, {"add_prefix_space", true}};
  auto tok = from(f);
  CHECK(tok->encode("hello world") == Ids{1, 271, 272, 263, 265, 262, 266});
  HfEncodeOptions no_bos;
  no_bos.add_special_tokens = false;
  CHECK(tok->decode(tok->encode("hello world", no_bos)) == "hello world");
  CHECK(tok->decode(tok->encode("hello world")) == "<s> hello world");
  // prepend_scheme "first": only the part at the start of the text gets ▁.
  f["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", kMeta}, {"prepend_scheme", "first"}, {"split", true}};
  auto first = from(f);
  CHECK(first->encode("hello</s>hello", no_bos) == Ids{271, 2, 260, 261, 268, 263});
  f["pre_tokenizer"]["prepend_scheme"] = "never";
  CHECK(from(f)->encode("hello", no_bos) == Ids{260, 261, 268, 263});
}

TEST_CASE("added tokens: normalized ones, lstrip / rstrip, longest match", "[tokenizer][hf]") {
  json f = llama2_file();
  // "hell" (normalized: matched as ▁hell in the normalized text) and "<x>" / "<xy>" (raw).
  f["model"]["vocab"]["<x>"] = 273;
  f["added_tokens"].push_back(added_token(273, "<x>", true, false));
  f["added_tokens"].push_back(added_token(274, "<xy>", false, false));
  json stripped = added_token(275, "<z>", true, false);
  stripped["lstrip"] = true;
  stripped["rstrip"] = true;
  f["added_tokens"].push_back(stripped);
  f["added_tokens"].push_back(added_token(276, "hell", false, true));
  auto tok = from(f);
  HfEncodeOptions no_bos;
  no_bos.add_special_tokens = false;
  CHECK(tok->vocab_size() == 277);
  CHECK(tok->encode("<xy>", no_bos) == Ids{274});  // the longest match at a position
  CHECK(tok->encode("<x>y", no_bos) == Ids{273, 259, 3 + 'y'});
  CHECK(tok->encode("e  <z>  e", no_bos) == Ids{259, 261, 275, 259, 261});  // the spaces go with <z>
  // "hell" is normalized: Prepend gives "▁hell", found in "▁hello" of the normalized text.
  CHECK(tok->encode("hello", no_bos) == Ids{276, 263});
  CHECK(tok->decode({276, 263}) == "hello");  // the added token decodes in its normalized form, "▁hell"
  HfEncodeOptions plain = no_bos;
  plain.match_special_tokens = false;
  CHECK(tok->encode("<x>", plain) == Ids{259, 3 + '<', 3 + 'x', 3 + '>'});
  CHECK(tok->encode("<xy>", plain) == Ids{274});  // not special: still matched
}

TEST_CASE("make_tokenizer(\"hf\") and load_tokenizer_dir", "[tokenizer][hf]") {
  const std::string path = write_file("one/tokenizer.json", llama2_file().dump());
  auto tok = make_tokenizer("hf", path);
  CHECK(tok->name() == "hf-bpe");
  CHECK(tok->encode("hello") == Ids{1, 271});
  CHECK(tok->bos_id() == 1);
  CHECK_FALSE(tok->eos_id().has_value());
  CHECK_THROWS_WITH(make_tokenizer("hf"),
                    Catch::Contains("the hf tokenizer needs the path of a Hugging Face tokenizer.json"));
  CHECK_THROWS_WITH(make_tokenizer("sp"), Catch::Contains("expected 'byte', 'gpt2' or 'hf'"));

  // A model folder: tokenizer.json, and BOS/EOS from tokenizer_config.json.
  const std::string dir = scratch() + "/model";
  write_file("model/tokenizer.json", llama2_file().dump());
  write_file("model/tokenizer_config.json",
             R"({"add_bos_token": true, "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
                 "unk_token": "<unk>"})");
  auto from_dir = load_tokenizer_dir(dir);
  REQUIRE(from_dir != nullptr);
  CHECK(from_dir->bos_id() == 1);
  CHECK(from_dir->eos_id() == 2);
  CHECK(from_dir->encode("hello world") == Ids{1, 271, 272, 263, 265, 262, 266});
  // Without a tokenizer_config.json: the template's BOS only.
  write_file("model_no_config/tokenizer.json", llama3_file().dump());
  auto l3 = load_tokenizer_dir(scratch() + "/model_no_config");
  REQUIRE(l3 != nullptr);
  CHECK(l3->bos_id() == 262);
  CHECK_FALSE(l3->eos_id().has_value());
  // A folder without tokenizer.json: nullptr.
  std::filesystem::create_directories(scratch() + "/empty_model");
  CHECK(load_tokenizer_dir(scratch() + "/empty_model") == nullptr);
  CHECK_THAT(error_of([&] { load_tokenizer_dir(scratch() + "/no_such_folder"); }), Catch::Contains("is not a folder"));
  write_file("model_bad_config/tokenizer.json", llama2_file().dump());
  write_file("model_bad_config/tokenizer_config.json", R"({"eos_token": "<|eot|>"})");
  CHECK_THAT(error_of([&] { load_tokenizer_dir(scratch() + "/model_bad_config"); }),
             Catch::Contains("tokenizer_config.json: eos_token: \"<|eot|>\" is not a token of"));
}

TEST_CASE("decode: an id outside the vocabulary names the id and the size", "[tokenizer][hf]") {
  auto tok = from(llama2_file(), "l2.json");
  CHECK_THAT(error_of([&] {
               tok->decode({1, 273});
             }),
             Catch::Contains("l2.json: decode: id 273 at position 1 is not in the vocabulary (size 273)"));
  CHECK_THAT(error_of([&] { tok->decode({-1}); }), Catch::Contains("id -1 at position 0"));
}

TEST_CASE("bad tokenizer.json files: errors name the file, the JSON path and what is supported", "[tokenizer][hf]") {
  const json l2 = llama2_file(), g2 = gpt2_file();
  auto err = [](json f, const std::function<void(json&)>& edit) { return load_error(std::move(f), edit); };
  using Catch::Contains;
  CHECK_THAT(error_of([] { HfTokenizer::load(scratch() + "/missing.json"); }), Contains("missing.json"));
  const std::string garbage = write_file("garbage.json", "{\"model\": ");
  CHECK_THAT(error_of([&] { HfTokenizer::load(garbage); }), Contains("garbage.json: invalid JSON"));
  CHECK_THAT(err(g2, [](json& f) { f = json::array(); }), Contains("expected a JSON object"));
  // Model types.
  for (const char* type : {"Unigram", "WordPiece", "WordLevel"}) {
    CHECK_THAT(
        err(g2, [&](json& f) { f["model"]["type"] = type; }),
        Contains("bad/tokenizer.json: model.type: \"" + std::string(type) + "\" is not supported (supported: BPE)"));
  }
  CHECK_THAT(err(g2, [](json& f) { f.erase("model"); }), Contains("tokenizer.json: model: missing"));
  CHECK_THAT(err(g2, [](json& f) { f["model"].erase("vocab"); }), Contains("model.vocab: missing"));
  CHECK_THAT(err(g2, [](json& f) { f["model"].erase("merges"); }), Contains("model.merges: missing"));
  CHECK_THAT(err(g2, [](json& f) { f["model"]["vocab"] = json::object(); }),
             Contains("model.vocab: the vocabulary is empty"));
  CHECK_THAT(err(g2, [](json& f) { f["model"]["vocab"]["he"] = 5; }),
             Contains("model.vocab[\"he\"]: id 5 is also the id of") || Contains("id 5 is also the id of \"he\""));
  CHECK_THAT(err(g2, [](json& f) { f["model"]["vocab"]["he"] = "x"; }),
             Contains("model.vocab[\"he\"]: expected an id in [0, 2^31 - 1), got \"x\""));
  // Merges.
  CHECK_THAT(err(g2, [](json& f) { f["model"]["merges"].push_back("q z3"); }),
             Contains("model.merges[5]: the token \"z3\" is not in model.vocab"));
  CHECK_THAT(err(g2, [](json& f) { f["model"]["merges"].push_back("o o"); }),
             Contains("model.merges[5]: the merge result \"oo\" is not in model.vocab"));
  CHECK_THAT(err(g2, [](json& f) { f["model"]["merges"].push_back("h  e"); }),
             Contains("model.merges[5]: \"h  e\" is not two tokens separated by one space"));
  CHECK_THAT(err(g2, [](json& f) { f["model"]["merges"].push_back(json::array({"h"})); }),
             Contains("model.merges[5]: expected \"left right\" or [\"left\", \"right\"]"));
  CHECK_THAT(err(g2, [](json& f) { f["model"]["merges"].push_back("h e"); }),
             Contains("model.merges[5]: duplicate merge [\"h\", \"e\"]"));
  // Model options.
  CHECK_THAT(err(g2, [](json& f) { f["model"]["dropout"] = 0.1; }), Contains("model.dropout: 0.1 is not supported"));
  CHECK_THAT(err(g2, [](json& f) { f["model"]["continuing_subword_prefix"] = "##"; }),
             Contains("model.continuing_subword_prefix: \"##\" is not supported (supported: null)"));
  CHECK_THAT(err(l2, [](json& f) { f["model"]["unk_token"] = "<UNK>"; }),
             Contains("model.unk_token: \"<UNK>\" is not in model.vocab"));
  CHECK_THAT(err(l2, [](json& f) { f["model"]["vocab"].erase("<0x41>"); }),
             Contains("model.byte_fallback: true, but the byte token <0x41> is not in model.vocab"));
  // Components.
  CHECK_THAT(err(l2,
                 [](json& f) {
                   f["normalizer"] = {{"type", "NFKC"}};
                 }),
             Contains("normalizer.type: normalizer 'NFKC' is not supported (supported: Prepend, Replace"));
  CHECK_THAT(err(l2,
                 [](json& f) {
                   f["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
                 }),
             Contains("normalizer.normalizers[1].pattern.Regex: a Regex pattern is not supported here"));
  CHECK_THAT(
      err(g2,
          [](json& f) {
            f["pre_tokenizer"] = {{"type", "Whitespace"}};
          }),
      Contains("pre_tokenizer.type: pre-tokenizer 'Whitespace' is not supported (supported: ByteLevel, Metaspace, "
               "Split"));
  CHECK_THAT(err(llama3_file(), [](json& f) { f["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; }),
             Contains("pre_tokenizer.pretokenizers[0].pattern.Regex: the pattern \"\\\\w+\" is not supported") &&
                 Contains("GPT-2's") && Contains("LLaMA-3's"));
  CHECK_THAT(err(llama3_file(), [](json& f) { f["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; }),
             Contains("pre_tokenizer.pretokenizers[0].behavior: 'Removed' is not supported (supported: Isolated)"));
  CHECK_THAT(err(llama3_file(), [](json& f) { f["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; }),
             Contains("pre_tokenizer.pretokenizers[0].invert: true is not supported"));
  CHECK_THAT(err(l2,
                 [](json& f) {
                   f["decoder"]["decoders"][2] = {{"type", "WordPiece"}};
                 }),
             Contains("decoder.decoders[2].type: decoder 'WordPiece' is not supported (supported: ByteLevel"));
  CHECK_THAT(err(l2,
                 [](json& f) {
                   f["post_processor"] = {{"type", "RobertaProcessing"}};
                 }),
             Contains("post_processor.type: post-processor 'RobertaProcessing' is not supported (supported: "
                      "TemplateProcessing"));
  CHECK_THAT(err(l2, [](json& f) { f["post_processor"]["special_tokens"]["<s>"]["ids"] = {999}; }),
             Contains("post_processor.special_tokens[\"<s>\"].ids[0]: 999 is not an id of the vocabulary (size 273)"));
  CHECK_THAT(err(l2,
                 [](json& f) {
                   f["truncation"] = {{"max_length", 8}};
                 }),
             Contains("truncation: not supported (tessel encodes whole texts): it must be null"));
  CHECK_THAT(err(l2,
                 [](json& f) {
                   f["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}};
                 }),
             Contains("pre_tokenizer.replacement: expected one character, got 'ab'"));
  // Added tokens.
  CHECK_THAT(err(l2, [](json& f) { f["added_tokens"][1]["id"] = 5; }),
             Contains("added_tokens[1].id: 5, but model.vocab gives \"<s>\" the id 1"));
  CHECK_THAT(err(g2, [](json& f) { f["added_tokens"][0]["id"] = 300; }),
             Contains("added_tokens[0].id: 300, but `tokenizers` numbers the added tokens that are not in model.vocab "
                      "from the vocabulary's size on, in order: this one gets 262"));
  CHECK_THAT(err(g2, [](json& f) { f["added_tokens"][0]["id"] = 7; }),
             Contains("added_tokens[0].id: 7 is also the id of"));
  CHECK_THAT(err(g2, [](json& f) { f["added_tokens"].push_back(f["added_tokens"][0]); }),
             Contains("added_tokens[1].content: \"<|endoftext|>\" is already added_tokens[0]"));
  CHECK_THAT(err(g2, [](json& f) { f["added_tokens"][0]["single_word"] = true; }),
             Contains("added_tokens[0].single_word: true is not supported"));
  CHECK_THAT(err(g2, [](json& f) { f["added_tokens"][0].erase("content"); }),
             Contains("added_tokens[0].content: missing"));
}
