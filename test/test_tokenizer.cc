// Tokenizers: the byte tokenizer, GPT-2's bytes-to-unicode table, the
// hand-written pre-tokeniser (against the regex's semantics, case by case),
// byte-level BPE on a miniature vocabulary (test/data/bpe_*) with encodings
// derived by hand from the merge ranks, round trips, and errors on corrupt files.
#include <catch2/catch.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "runtime/error.h"
#include "test/util/error_of.h"
#include "test/util/runfiles.h"
#include "train/tokenizer.h"
#include "train/unicode.h"

using namespace tessel;
using namespace tessel::train;
using tessel::testing::error_of;
using tessel::testing::data_path;
using Ids = std::vector<int32_t>;
using Pieces = std::vector<std::string>;

namespace {

std::shared_ptr<Gpt2BpeTokenizer> mini_bpe() {
  static auto tok = Gpt2BpeTokenizer::load(data_path("bpe_vocab.json"), data_path("bpe_merges.txt"));
  return tok;
}

Pieces pieces(std::string_view text) {
  Pieces out;
  for (auto p : pretokenize(text)) out.emplace_back(p);
  return out;
}

// Byte symbol ids of the miniature vocabulary (GPT-2 order): printable ASCII
// '!'..'~' are 0..93, so id = byte - 33; ' ' (Ġ) is 220, '\n' (Ċ) is 198.
int32_t b(char c) { return int32_t(static_cast<unsigned char>(c)) - 33; }
constexpr int32_t kSpace = 220, kNewline = 198;

std::string write_file(const std::string& name, const std::string& content) {
  static const std::string dir = tessel::testing::scratch_dir("tokenizer");
  std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << content;
  return path;
}

}  // namespace

TEST_CASE("ByteTokenizer is the identity on bytes", "[tokenizer]") {
  ByteTokenizer tok;
  CHECK(tok.vocab_size() == 256);
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(char(i));
  Ids ids = tok.encode(all);
  REQUIRE(ids.size() == 256);
  for (int i = 0; i < 256; ++i) CHECK(ids[i] == i);
  CHECK(tok.decode(ids) == all);
  CHECK(tok.encode("Hi\n") == Ids{72, 105, 10});
  CHECK_THROWS_AS(tok.decode({256}), Error);
  CHECK_THROWS_WITH(tok.decode({65, -1}), Catch::Contains("position 1"));
}

TEST_CASE("bytes_to_unicode matches GPT-2's table", "[tokenizer]") {
  const auto& t = bytes_to_unicode();
  REQUIRE(t.size() == 256);
  CHECK(t['!'] == '!');
  CHECK(t['~'] == '~');
  CHECK(t[0xA1] == 0xA1);
  CHECK(t[0xAC] == 0xAC);
  CHECK(t[0xAE] == 0xAE);
  CHECK(t[0xFF] == 0xFF);
  CHECK(t[0] == 0x100);      // Ā
  CHECK(t['\n'] == 0x10A);   // Ċ
  CHECK(t[' '] == 0x120);    // Ġ
  CHECK(t[0x7F] == 0x121);   // DEL, the 34th non-printable byte
  CHECK(t[0xAD] == 0x143);   // soft hyphen, the last one (256 + 67)
  std::vector<bool> seen(0x144, false);
  for (uint32_t c : t) {
    REQUIRE(c < seen.size());
    CHECK_FALSE(seen[c]);
    seen[c] = true;
  }
}

TEST_CASE("Unicode classes for the pre-tokeniser", "[tokenizer][unicode]") {
  using namespace tessel::train::unicode;
  CHECK(std::string(table_version()) == "14.0.0");
  for (uint32_t c : {U'a', U'Z', U'é', U'ß', U'Ω', U'ж', U'日', U'ア', U'한', U'ـ' /*Lm*/, U'ª' /*Lo*/}) {
    INFO(c);
    CHECK(is_letter(c));
    CHECK_FALSE(is_number(c));
  }
  for (uint32_t c : {U'0', U'9', U'²' /*No*/, U'½', U'٣' /*Arabic-Indic 3*/, U'Ⅻ' /*Nl*/, U'〇'}) {
    INFO(c);
    CHECK(is_number(c));
    CHECK_FALSE(is_letter(c));
  }
  for (uint32_t c : {U' ', U'\t', U'\n', U'\r', U'\v', U'\f', char32_t(0x85), U'\u00A0', U'\u2003', U'\u3000'}) {
    INFO(c);
    CHECK(is_whitespace(c));
  }
  for (uint32_t c : {U'!', U'\'', U'-', U'≈', U'€', U'😀', U'\u0301' /*combining acute: Mn*/, char32_t(0x1C)}) {
    INFO(c);
    CHECK_FALSE(is_letter(c));
    CHECK_FALSE(is_number(c));
    CHECK_FALSE(is_whitespace(c));
  }
  // Strict UTF-8 decoding: invalid bytes become single "invalid" code points.
  auto cps = decode_utf8("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  REQUIRE(cps.size() == 4);
  CHECK(cps[1].cp == 0xE9);
  CHECK(cps[2].cp == 0x20AC);
  CHECK(cps[3].cp == 0x1F600);
  CHECK(cps[3].offset == 6);
  CHECK(cps[3].length == 4);
  for (const char* bad : {"\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xC3", "\x80"}) {
    for (const auto& c : decode_utf8(bad)) {
      CHECK(c.cp >= kInvalidByte);
      CHECK(c.length == 1);
    }
  }
}

TEST_CASE("pretokenize follows GPT-2's regex", "[tokenizer]") {
  // Letters, numbers and other runs, each taking one leading space.
  CHECK(pieces("Hello world") == Pieces{"Hello", " world"});
  CHECK(pieces("abc123def") == Pieces{"abc", "123", "def"});
  CHECK(pieces("x = 42;") == Pieces{"x", " =", " 42", ";"});
  CHECK(pieces("Hi!!! ...ok") == Pieces{"Hi", "!!!", " ...", "ok"});
  // Contractions: lower case, ASCII apostrophe only.
  CHECK(pieces("I'll we're you've it's don't he'd I'm") ==
        Pieces{"I", "'ll", " we", "'re", " you", "'ve", " it", "'s", " don", "'t", " he", "'d", " I", "'m"});
  CHECK(pieces("IT'S") == Pieces{"IT", "'", "S"});
  CHECK(pieces("it''s") == Pieces{"it", "''", "s"});
  CHECK(pieces("x 's") == Pieces{"x", " '", "s"});
  CHECK(pieces("'sa") == Pieces{"'s", "a"});
  // Whitespace runs: the last space of a run before a word joins the word.
  CHECK(pieces("a  b") == Pieces{"a", " ", " b"});
  CHECK(pieces("a   \n\nb") == Pieces{"a", "   \n", "\n", "b"});
  CHECK(pieces("a\nb") == Pieces{"a", "\n", "b"});
  CHECK(pieces("hi  ") == Pieces{"hi", "  "});
  CHECK(pieces("  lead") == Pieces{" ", " lead"});
  CHECK(pieces("a \n b") == Pieces{"a", " \n", " b"});
  CHECK(pieces("\t\tx") == Pieces{"\t", "\t", "x"});
  CHECK(pieces(" ") == Pieces{" "});
  CHECK(pieces("").empty());
  // Unicode classes.
  CHECK(pieces("café 日本語 x² Ω≈") == Pieces{"café", " 日本語", " x", "²", " Ω", "≈"});
  CHECK(pieces("a\u00A0b") == Pieces{"a", "\u00A0", "b"});  // NBSP is \s, but only ' ' prefixes a word
  CHECK(pieces("naïve résumé") == Pieces{"naïve", " résumé"});
  CHECK(pieces("e\u0301") == Pieces{"e", "\u0301"});  // a combining mark (Mn) is neither L nor N
  // Bytes that are not UTF-8 are "other" characters.
  CHECK(pieces("a\xFF\xFE b") == Pieces{"a", "\xFF\xFE", " b"});
  // The pieces always tile the input.
  std::string text = "Mixed: 12 apples, 3.5 pears\t\n  and 'quotes' — ok?  ";
  std::string joined;
  for (auto& p : pieces(text)) joined += p;
  CHECK(joined == text);
}

TEST_CASE("GPT-2 BPE on the miniature vocabulary: hand-derived encodings", "[tokenizer]") {
  auto tok = mini_bpe();
  CHECK(tok->vocab_size() == 273);
  CHECK(tok->num_merges() == 16);
  CHECK(tok->token_id("Ġthe") == 258);
  CHECK(tok->token_id("<|endoftext|>") == 272);
  CHECK_FALSE(tok->token_id("nope").has_value());

  // " the": (Ġ,t) rank 0 -> Ġt; (h,e) rank 1 -> he; (Ġt,he) rank 2 -> Ġthe.
  CHECK(tok->bpe(" the") == Pieces{"Ġthe"});
  CHECK(tok->encode(" the") == Ids{258});
  // "the" (no space): (h,e) rank 1 beats (t,h) rank 10; nothing merges t+he.
  CHECK(tok->bpe("the") == Pieces{"t", "he"});
  // "ther": (h,e) takes the e before (e,r) rank 5 can.
  CHECK(tok->encode("ther") == Ids{b('t'), 257, b('r')});
  // " thing": Ġt (0), in (3), ing (6); "th" (10) cannot apply, Ġt took the t.
  CHECK(tok->bpe(" thing") == Pieces{"Ġt", "h", "ing"});
  // Non-overlapping, left to right: aaa -> aa a; aaaaa -> aa aa a -> aaaa a.
  CHECK(tok->bpe("aaa") == Pieces{"aa", "a"});
  CHECK(tok->bpe("aaaaa") == Pieces{"aaaa", "a"});
  CHECK(tok->encode("aaaaa") == Ids{268, b('a')});

  CHECK(tok->encode("the cat") == Ids{b('t'), 257, kSpace, b('c'), b('a'), b('t')});
  CHECK(tok->encode("Hello world") ==
        Ids{b('H'), b('e'), 263, b('o'), kSpace, b('w'), b('o'), b('r'), b('l'), b('d')});
  CHECK(tok->encode("the thing's") == Ids{b('t'), 257, 256, b('h'), 262, 264});
  CHECK(tok->encode(" a") == Ids{260});
  // Whitespace: "   \n" -> ĠĠ Ġ Ċ; then "\n" alone; "b".
  CHECK(tok->encode("a   \n\nb") == Ids{b('a'), 265, kSpace, kNewline, kNewline, b('b')});
  CHECK(tok->encode("\n\n") == Ids{271});
  CHECK(tok->encode("hi  ") == Ids{b('h'), b('i'), 265});
  // "é" is bytes C3 A9 -> symbols Ã © -> merged (rank 13).
  CHECK(tok->encode("café 2024!") == Ids{b('c'), b('a'), b('f'), 269, kSpace, 270, b('2'), b('4'), b('!')});
  // Special tokens are not recognised inside text (encode_ordinary).
  CHECK(tok->encode("<|endoftext|>") != Ids{272});
  CHECK(tok->decode({272}) == "<|endoftext|>");
  CHECK(tok->decode({258, 220, 269}) == " the é");
  CHECK_THROWS_WITH(tok->decode({273}), Catch::Contains("id 273"));
  // The cache returns the same result the second time.
  CHECK(tok->encode(" the the the") == Ids{258, 258, 258});
}

TEST_CASE("GPT-2 BPE round-trips arbitrary text", "[tokenizer]") {
  auto tok = mini_bpe();
  const std::vector<std::string> texts = {
      "",
      "The quick brown fox jumps over the lazy dog.",
      "they're here, isn't it? We'll see; I'd say it's the thing's end.",
      "   leading and trailing   \n\n\n\t \r\n",
      "tabs\tand\nnewlines\n\n  indented\n",
      "Ünïcödé: café, naïve, 日本語テキスト, Ελληνικά, русский, 한국어, emoji 😀👍🏽",
      "numbers 2024 3.14159 1,000,000 ½ ² Ⅻ",
      "punctuation!!! ??? ... --- ''' \"\"\" ((()))",
      std::string("control \x01\x02\x7f and invalid \xff\xfe\xc3 bytes", 33),
      "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa thththth inginging",
  };
  for (const auto& t : texts) {
    INFO(t);
    Ids ids = tok->encode(t);
    for (int32_t id : ids) CHECK((id >= 0 && id < tok->vocab_size()));
    CHECK(tok->decode(ids) == t);
  }
  // All 256 bytes, in every order of a few rotations.
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(char(i));
  for (int r : {0, 1, 97, 200}) {
    std::string s = all.substr(r) + all.substr(0, r);
    CHECK(tok->decode(tok->encode(s)) == s);
  }
}

TEST_CASE("corrupt vocab/merges files are errors naming the file and line/key", "[tokenizer]") {
  const std::string vocab = data_path("bpe_vocab.json"), merges = data_path("bpe_merges.txt");
  std::string e;

  e = error_of([&] { Gpt2BpeTokenizer::load(data_path("bad_vocab.json"), merges); });
  CHECK_THAT(e, Catch::Contains("bad_vocab.json") && Catch::Contains("invalid JSON") && Catch::Contains("line 4"));

  e = error_of([&] { Gpt2BpeTokenizer::load(vocab, data_path("merges_missing_token.txt")); });
  CHECK_THAT(e, Catch::Contains("merges_missing_token.txt:3") && Catch::Contains("'Ġth'") &&
                    Catch::Contains("not in the vocabulary"));

  e = error_of([&] { Gpt2BpeTokenizer::load(vocab, data_path("merges_malformed.txt")); });
  CHECK_THAT(e, Catch::Contains("merges_malformed.txt:3") && Catch::Contains("malformed merge line 'h e x'"));

  // A merge whose result is missing from the vocabulary.
  std::string m = write_file("result_missing.txt", "#version: 0.2\nĠ t\nq z\n");
  e = error_of([&] { Gpt2BpeTokenizer::load(vocab, m); });
  CHECK_THAT(e, Catch::Contains("result_missing.txt:3") && Catch::Contains("produces the token 'qz'"));

  m = write_file("duplicate.txt", "Ġ t\nh e\nĠ t\n");
  e = error_of([&] { Gpt2BpeTokenizer::load(vocab, m); });
  CHECK_THAT(e, Catch::Contains("duplicate.txt:3") && Catch::Contains("duplicate merge"));

  // Vocabulary problems name the key.
  std::string v = write_file("few.json", "{\"a\": 0, \"b\": 1}");
  e = error_of([&] { Gpt2BpeTokenizer::load(v, merges); });
  CHECK_THAT(e, Catch::Contains("few.json") && Catch::Contains("byte 0x00") && Catch::Contains("missing"));

  v = write_file("notint.json", "{\"a\": 0, \"b\": \"one\"}");
  e = error_of([&] { Gpt2BpeTokenizer::load(v, merges); });
  CHECK_THAT(e, Catch::Contains("notint.json") && Catch::Contains("key 'b'") && Catch::Contains("integer"));

  v = write_file("dup_id.json", "{\"a\": 0, \"b\": 0}");
  e = error_of([&] { Gpt2BpeTokenizer::load(v, merges); });
  CHECK_THAT(e, Catch::Contains("dup_id.json") && Catch::Contains("id 0 is also used"));

  v = write_file("badchar.json", "{\"a b\": 0}");  // ' ' is not a bytes-to-unicode character
  e = error_of([&] { Gpt2BpeTokenizer::load(v, merges); });
  CHECK_THAT(e, Catch::Contains("badchar.json") && Catch::Contains("key 'a b'") && Catch::Contains("U+0020"));

  v = write_file("array.json", "[1, 2]");
  e = error_of([&] { Gpt2BpeTokenizer::load(v, merges); });
  CHECK_THAT(e, Catch::Contains("array.json") && Catch::Contains("JSON object"));

  e = error_of([&] { Gpt2BpeTokenizer::load(data_path("no_such_vocab.json"), merges); });
  CHECK_THAT(e, Catch::Contains("no_such_vocab.json") && Catch::Contains("no such file"));

  e = error_of([&] { make_tokenizer("sentencepiece"); });
  CHECK_THAT(e, Catch::Contains("unknown tokenizer 'sentencepiece'"));
  CHECK(make_tokenizer("byte")->vocab_size() == 256);
  CHECK(make_tokenizer("gpt2", vocab, merges)->vocab_size() == 273);
}
