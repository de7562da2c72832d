// StreamDecoder: turns a growing sequence of generated ids into text deltas. A delta never
// ends inside a UTF-8 character or an unfinished run of <0xXX> byte-fallback tokens, and
// the deltas of push() and finish() concatenate to exactly tokenizer.decode(all ids).
//
// How: only the ids after the last emitted text are decoded, behind one "anchor" token (a
// single ASCII letter) whose text is then cut off. The anchor stands in for everything
// before, so decoders that treat the first token specially (SentencePiece's leading-space
// strip, Metaspace) see the new ids as mid-text ids, and each step costs O(new ids).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace strata::tokenizer {

class StreamDecoder {
 public:
  StreamDecoder(Tokenizer tokenizer, bool skip_special);

  // Adds one id; returns the text that became final (often empty while a character is
  // incomplete).
  std::string push(int32_t id);
  // Returns what is still held back (an incomplete character decodes to U+FFFD here).
  std::string finish();

  const std::vector<int32_t>& ids() const { return ids_; }

 private:
  // Text of ids_[window_start_:] as it reads after the earlier ids; false when the anchor
  // did not come through decoding unchanged.
  bool window_text(std::string& text) const;
  bool holds_back(const std::string& text) const;

  Tokenizer tokenizer_;
  bool skip_special_;
  std::vector<int32_t> ids_;
  size_t window_start_ = 0;  // first id whose text has not been emitted
  int32_t anchor_id_ = -1;   // -1: no anchor token, every step decodes from the start
  std::string anchor_text_;
  size_t emitted_bytes_ = 0;  // total text emitted so far
};

}  // namespace strata::tokenizer
