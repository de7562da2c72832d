// Vocabulary: what a grammar needs to know of a tokenizer, built once per tokenizer and shared:
// the bytes each token id stands for, which ids are special (never produced under a grammar)
// and which stop the output (allowed only where the grammar can end). Tokens are kept sorted
// by their bytes with the common-prefix length to the previous one, so a mask is a walk of a
// virtual trie: tokens sharing a prefix share the parser work for it. The engine builds it from
// tokenizer::Tokenizer::token_bytes(id) for every id; this library does not link the tokenizer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace strata::grammar {

class Vocabulary {
 public:
  // token_bytes[id]: the bytes of token id (empty for ids with no text). special_ids: control
  // tokens; stop_ids: EOS and other end-of-turn ids (a stop id is never matched as text).
  static Result<std::shared_ptr<const Vocabulary>> create(std::vector<std::string> token_bytes,
                                                          const std::vector<int32_t>& special_ids,
                                                          const std::vector<int32_t>& stop_ids);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  int32_t mask_words() const { return (size() + 31) / 32; }  // uint32 words of a token bitmask
  const std::string& token(int32_t id) const { return bytes_[id]; }
  bool is_stop(int32_t id) const { return kind_[id] == kStop; }
  bool is_special(int32_t id) const { return kind_[id] != kText; }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }

  // Text tokens (non-special, non-empty) in byte order; lcp()[i]: bytes shared with sorted()[i-1].
  const std::vector<int32_t>& sorted() const { return sorted_; }
  const std::vector<uint16_t>& lcp() const { return lcp_; }
  // The bytes of sorted()[pos], from one contiguous buffer (walks read it sequentially).
  std::string_view sorted_token(int32_t pos) const {
    return std::string_view(sorted_bytes_.data() + sorted_offset_[pos], sorted_offset_[pos + 1] - sorted_offset_[pos]);
  }
  // Sorted positions of the tokens starting with byte b: [first_begin(b), first_begin(b + 1)).
  int32_t first_begin(int b) const { return first_begin_[b]; }
  size_t max_token_bytes() const { return max_len_; }

 private:
  enum Kind : uint8_t { kText, kSpecial, kStop };
  std::vector<std::string> bytes_;
  std::vector<Kind> kind_;
  std::vector<int32_t> stop_ids_;
  std::vector<int32_t> sorted_;
  std::vector<uint16_t> lcp_;
  std::string sorted_bytes_;
  std::vector<uint32_t> sorted_offset_;  // [sorted.size() + 1]
  std::vector<int32_t> first_begin_;  // 257 entries
  size_t max_len_ = 0;
};

// The bytes of a byte-level BPE piece (GPT-2's byte-to-printable mapping inverted, e.g. "Ġ" ->
// " "). A piece with a character outside that mapping is returned as its UTF-8 text.
std::string byte_level_piece_bytes(std::string_view piece);
// The bytes of a SentencePiece piece: "<0xNN>" -> that byte, "▁" -> " ".
std::string sentencepiece_piece_bytes(std::string_view piece);

}  // namespace strata::grammar
