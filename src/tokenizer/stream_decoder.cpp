#include "tokenizer/stream_decoder.h"

namespace strata::tokenizer {
namespace {

bool is_byte_piece(const std::string& piece) {
  return piece.size() == 6 && piece.compare(0, 3, "<0x") == 0 && piece[5] == '>';
}

bool ends_with_replacement(const std::string& text) {
  return text.size() >= 3 && text.compare(text.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

}  // namespace

StreamDecoder::StreamDecoder(Tokenizer tokenizer, bool skip_special)
    : tokenizer_(std::move(tokenizer)), skip_special_(skip_special) {
  for (const char* letter : {"a", "e", "x", "A", "0"}) {
    const int32_t id = tokenizer_.piece_to_id(letter);
    if (id < 0 || tokenizer_.is_special(id)) continue;
    const std::string text = tokenizer_.decode(&id, 1, false);
    if (text == letter) {
      anchor_id_ = id;
      anchor_text_ = text;
      break;
    }
  }
}

bool StreamDecoder::window_text(std::string& text) const {
  if (window_start_ == 0) {
    text = tokenizer_.decode(ids_.data(), ids_.size(), skip_special_);
    return true;
  }
  std::vector<int32_t> window;
  window.reserve(ids_.size() - window_start_ + 1);
  window.push_back(anchor_id_);
  window.insert(window.end(), ids_.begin() + static_cast<std::ptrdiff_t>(window_start_), ids_.end());
  text = tokenizer_.decode(window, skip_special_);
  if (text.compare(0, anchor_text_.size(), anchor_text_) != 0) return false;
  text.erase(0, anchor_text_.size());
  return true;
}

bool StreamDecoder::holds_back(const std::string& text) const {
  if (ends_with_replacement(text)) return true;  // maybe a character still arriving
  // A byte-fallback run is decoded as a whole (invalid runs become U+FFFD per byte), so
  // nothing of it is final until a non-byte token closes it.
  const int32_t last = ids_.back();
  return !tokenizer_.is_special(last) && is_byte_piece(tokenizer_.id_to_piece(last));
}

std::string StreamDecoder::push(int32_t id) {
  ids_.push_back(id);
  std::string text;
  if (anchor_id_ >= 0 && !window_text(text)) anchor_id_ = -1;  // the anchor did not survive: decode in full
  if (anchor_id_ < 0) {
    const std::string all = tokenizer_.decode(ids_, skip_special_);
    if (holds_back(all) || all.size() <= emitted_bytes_) return std::string();
    std::string delta = all.substr(emitted_bytes_);
    emitted_bytes_ = all.size();
    return delta;
  }
  // An empty window (skipped specials, a lone stripped space) stays open: the next ids must
  // still be read as the start of the text.
  if (text.empty() || holds_back(text)) return std::string();
  window_start_ = ids_.size();
  emitted_bytes_ += text.size();
  return text;
}

std::string StreamDecoder::finish() {
  std::string text;
  if (anchor_id_ >= 0 && window_start_ < ids_.size() && !window_text(text)) anchor_id_ = -1;
  if (anchor_id_ < 0) {
    const std::string all = tokenizer_.decode(ids_, skip_special_);
    std::string delta = all.size() > emitted_bytes_ ? all.substr(emitted_bytes_) : std::string();
    emitted_bytes_ = all.size();
    return delta;
  }
  window_start_ = ids_.size();
  emitted_bytes_ += text.size();
  return text;
}

}  // namespace strata::tokenizer
