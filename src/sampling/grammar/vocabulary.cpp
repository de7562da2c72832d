#include "sampling/grammar/vocabulary.h"

#include <algorithm>
#include <array>
#include <numeric>

namespace strata::grammar {

Result<std::shared_ptr<const Vocabulary>> Vocabulary::create(std::vector<std::string> token_bytes,
                                                             const std::vector<int32_t>& special_ids,
                                                             const std::vector<int32_t>& stop_ids) {
  auto v = std::make_shared<Vocabulary>();
  const int32_t n = static_cast<int32_t>(token_bytes.size());
  if (n == 0) return make_error(ErrorCode::kInvalidArgument, "vocabulary: no tokens");
  v->bytes_ = std::move(token_bytes);
  v->kind_.assign(n, kText);
  for (int32_t id : special_ids) {
    if (id < 0 || id >= n)
      return make_error(ErrorCode::kOutOfRange, "vocabulary: special id " + std::to_string(id) + " out of range");
    v->kind_[id] = kSpecial;
  }
  for (int32_t id : stop_ids) {
    if (id < 0 || id >= n)
      return make_error(ErrorCode::kOutOfRange, "vocabulary: stop id " + std::to_string(id) + " out of range");
    if (v->kind_[id] != kStop) v->stop_ids_.push_back(id);
    v->kind_[id] = kStop;
  }
  for (int32_t id = 0; id < n; ++id) {
    if (v->kind_[id] != kText || v->bytes_[id].empty()) continue;
    if (v->bytes_[id].size() > 65535)
      return make_error(ErrorCode::kOutOfRange, "vocabulary: token " + std::to_string(id) + " longer than 65535 bytes");
    v->sorted_.push_back(id);
    v->max_len_ = std::max(v->max_len_, v->bytes_[id].size());
  }
  const auto& b = v->bytes_;
  std::sort(v->sorted_.begin(), v->sorted_.end(), [&](int32_t x, int32_t y) {
    return b[x] != b[y] ? b[x] < b[y] : x < y;  // std::string compares as unsigned bytes
  });
  v->sorted_offset_.assign(1, 0);
  for (int32_t id : v->sorted_) {
    v->sorted_bytes_ += b[id];
    v->sorted_offset_.push_back(static_cast<uint32_t>(v->sorted_bytes_.size()));
  }
  v->lcp_.assign(v->sorted_.size(), 0);
  for (size_t i = 1; i < v->sorted_.size(); ++i) {
    const std::string& p = b[v->sorted_[i - 1]];
    const std::string& q = b[v->sorted_[i]];
    size_t k = 0;
    while (k < p.size() && k < q.size() && p[k] == q[k]) ++k;
    v->lcp_[i] = static_cast<uint16_t>(k);
  }
  v->first_begin_.assign(257, 0);
  size_t pos = 0;
  for (int c = 0; c <= 256; ++c) {
    while (pos < v->sorted_.size() && static_cast<uint8_t>(b[v->sorted_[pos]][0]) < c) ++pos;
    v->first_begin_[c] = static_cast<int32_t>(c == 256 ? v->sorted_.size() : pos);
  }
  return std::shared_ptr<const Vocabulary>(std::move(v));
}

static void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

// Decodes one UTF-8 code point at s[i]; advances i. Invalid bytes decode as themselves.
static uint32_t next_code_point(std::string_view s, size_t& i) {
  const auto c = static_cast<uint8_t>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

std::string byte_level_piece_bytes(std::string_view piece) {
  // GPT-2: printable bytes map to themselves, the other 68 to U+0100.. in byte order.
  static const std::array<int32_t, 512> to_byte = [] {
    std::array<int32_t, 512> t;
    t.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      t[printable ? b : 256 + extra++] = b;
    }
    return t;
  }();
  std::string out;
  std::string text;
  bool mapped = true;
  for (size_t i = 0; i < piece.size();) {
    const uint32_t cp = next_code_point(piece, i);
    if (cp < 512 && to_byte[cp] >= 0) {
      out += char(to_byte[cp]);
    } else {
      mapped = false;
    }
    append_utf8(text, cp);
  }
  return mapped ? out : text;
}

std::string sentencepiece_piece_bytes(std::string_view piece) {
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1; };
  if (piece.size() == 6 && piece.substr(0, 3) == "<0x" && piece[5] == '>' && hex(piece[3]) >= 0 && hex(piece[4]) >= 0)
    return std::string(1, char(hex(piece[3]) * 16 + hex(piece[4])));
  std::string out;
  static constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581
  for (size_t i = 0; i < piece.size();) {
    if (piece.substr(i, 3) == kSpace) {
      out += ' ';
      i += 3;
    } else {
      out += piece[i++];
    }
  }
  return out;
}

}  // namespace strata::grammar
