// UTF-8 and Unicode helpers shared by the tokenizer stages: strict validation, code point
// iteration, the character classes Hugging Face `tokenizers` tests (Rust's char methods),
// and the GPT-2 byte <-> printable-character map of byte-level BPE.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata::tokenizer {

// Byte offset of the first byte that does not start a well-formed UTF-8 sequence (overlong
// forms, surrogates and code points past U+10FFFF are ill-formed), or nullopt when valid.
std::optional<size_t> find_invalid_utf8(std::string_view text);

// Decodes the code point at text[pos] of valid UTF-8 and advances pos past it.
inline uint32_t next_code_point(std::string_view text, size_t& pos) {
  const auto b0 = static_cast<unsigned char>(text[pos]);
  if (b0 < 0x80) {
    ++pos;
    return b0;
  }
  if (b0 < 0xE0) {
    const uint32_t cp = ((b0 & 0x1Fu) << 6) | (static_cast<unsigned char>(text[pos + 1]) & 0x3Fu);
    pos += 2;
    return cp;
  }
  if (b0 < 0xF0) {
    const uint32_t cp = ((b0 & 0x0Fu) << 12) | ((static_cast<unsigned char>(text[pos + 1]) & 0x3Fu) << 6) |
                        (static_cast<unsigned char>(text[pos + 2]) & 0x3Fu);
    pos += 3;
    return cp;
  }
  const uint32_t cp = ((b0 & 0x07u) << 18) | ((static_cast<unsigned char>(text[pos + 1]) & 0x3Fu) << 12) |
                      ((static_cast<unsigned char>(text[pos + 2]) & 0x3Fu) << 6) |
                      (static_cast<unsigned char>(text[pos + 3]) & 0x3Fu);
  pos += 4;
  return cp;
}

// Length in bytes of the UTF-8 sequence whose lead byte is `lead` (1 for stray bytes).
inline size_t utf8_sequence_length(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

void append_utf8(std::string& out, uint32_t cp);

// Rust's char::is_whitespace (the Unicode White_Space property).
bool is_unicode_whitespace(uint32_t cp);
// Rust regex `\w`: letters, marks, decimal digits, connector punctuation.
bool is_word_char(uint32_t cp);
// Rust's char::is_numeric: general categories Nd, Nl, No.
bool is_numeric_char(uint32_t cp);

// Replaces every ill-formed sequence with U+FFFD the way Rust's String::from_utf8_lossy
// does (one replacement per maximal invalid subpart).
std::string utf8_lossy(std::string_view bytes);

// The GPT-2 byte-level alphabet: every byte maps to a printable code point.
uint32_t byte_to_unicode(uint8_t byte);
// The byte a byte-level character stands for, or -1 when `cp` is not in the alphabet.
int unicode_to_byte(uint32_t cp);

}  // namespace strata::tokenizer
