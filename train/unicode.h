#pragma once
// The small piece of Unicode the GPT-2 pre-tokeniser needs: UTF-8 decoding
// that never fails, and the three classes its regex uses — \p{L} (letters),
// \p{N} (numbers) and \s (whitespace).
//
// Letters and numbers come from range tables generated from Python's
// unicodedata (train/gen_unicode_tables.py; the Unicode version is
// kUnicodeVersion, 14.0.0 at the time of writing): general categories
// Lu/Ll/Lt/Lm/Lo and Nd/Nl/No exactly, for that version. Whitespace is the
// Unicode White_Space property (what the `regex` package used by GPT-2 and
// tiktoken's Rust regex match with \s); Python's `re` would also count
// U+001C..U+001F, which we do not.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessel::train::unicode {

// Code points above this mark bytes that were not valid UTF-8: kInvalidByte + b.
// They classify as "other" (neither letter, number nor whitespace), so a
// string that is not valid UTF-8 still splits and round-trips byte for byte.
inline constexpr uint32_t kInvalidByte = 0x110000;

struct CodePoint {
  uint32_t cp;       // the code point, or kInvalidByte + byte
  uint32_t offset;   // byte offset in the input
  uint32_t length;   // bytes (1..4)
};

// Decodes UTF-8 strictly (no overlong forms, no surrogates, nothing above
// U+10FFFF); every byte that does not start a valid sequence becomes one
// kInvalidByte code point of length 1.
std::vector<CodePoint> decode_utf8(std::string_view s);
// Appends the UTF-8 encoding of a valid code point.
void append_utf8(std::string& out, uint32_t cp);

bool is_letter(uint32_t cp);      // \p{L}
bool is_number(uint32_t cp);      // \p{N}
bool is_whitespace(uint32_t cp);  // \s (Unicode White_Space)

// The Unicode version of the letter/number tables.
const char* table_version();

}  // namespace tessel::train::unicode
