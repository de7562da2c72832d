#include "tokenizer/added_vocab.h"

#include <algorithm>

#include "tokenizer/unicode.h"

namespace strata::tokenizer {
namespace {

// Code point ending at byte `end` of valid UTF-8.
uint32_t code_point_before(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
  return next_code_point(text, start);
}

bool ends_with_word(std::string_view text, size_t end) { return end > 0 && is_word_char(code_point_before(text, end)); }

bool starts_with_word(std::string_view text, size_t start) {
  if (start >= text.size()) return false;
  size_t pos = start;
  return is_word_char(next_code_point(text, pos));
}

}  // namespace

void AddedVocab::Trie::add(std::string_view pattern, int32_t token) {
  if (pattern.empty()) return;
  int32_t node = 0;
  for (char c : pattern) {
    const auto b = static_cast<uint8_t>(c);
    auto& children = nodes[static_cast<size_t>(node)].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(b, int32_t{-1}),
                               [](const auto& a, const auto& v) { return a.first < v.first; });
    if (it != children.end() && it->first == b) {
      node = it->second;
    } else {
      const auto child = static_cast<int32_t>(nodes.size());
      children.insert(it, {b, child});
      nodes.emplace_back();
      node = child;
    }
  }
  first_byte[static_cast<uint8_t>(pattern[0])] = true;
  // The first token listed with a given pattern keeps it.
  if (nodes[static_cast<size_t>(node)].token < 0) nodes[static_cast<size_t>(node)].token = token;
}

std::pair<size_t, int32_t> AddedVocab::Trie::longest(std::string_view text, size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    const auto b = static_cast<uint8_t>(text[i]);
    const auto& children = nodes[static_cast<size_t>(node)].children;
    auto it = std::lower_bound(children.begin(), children.end(), std::make_pair(b, int32_t{-1}),
                               [](const auto& a, const auto& v) { return a.first < v.first; });
    if (it == children.end() || it->first != b) break;
    node = it->second;
    if (nodes[static_cast<size_t>(node)].token >= 0) best = {i + 1 - pos, nodes[static_cast<size_t>(node)].token};
  }
  return best;
}

void AddedVocab::build(std::vector<AddedToken> tokens, const std::vector<std::string>& patterns) {
  tokens_ = std::move(tokens);
  raw_ = Trie{};
  normalized_ = Trie{};
  by_id_.clear();
  by_content_.clear();
  // Special tokens are searched ahead of plain added ones, as in the reference.
  std::vector<size_t> order(tokens_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return tokens_[a].special && !tokens_[b].special; });
  for (size_t i : order) {
    const AddedToken& t = tokens_[i];
    by_id_[t.id] = i;
    by_content_.emplace(t.content, t.id);
    (t.normalized ? normalized_ : raw_).add(patterns[i], static_cast<int32_t>(i));
  }
}

void AddedVocab::split(std::string_view text, bool normalized_set, std::vector<TextPiece>& out) const {
  const Trie& trie = normalized_set ? normalized_ : raw_;
  size_t start_offset = 0;
  size_t pos = 0;
  const bool any = trie.nodes.size() > 1;
  while (any && pos < text.size()) {
    if (!trie.first_byte[static_cast<uint8_t>(text[pos])]) {
      ++pos;
      continue;
    }
    const auto [len, token_index] = trie.longest(text, pos);
    if (token_index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = tokens_[static_cast<size_t>(token_index)];
    size_t start = pos, stop = pos + len;
    if (t.single_word) {
      const bool space_before = start == 0 || !ends_with_word(text, start);
      const bool space_after = stop == text.size() || !starts_with_word(text, stop);
      if (!space_before || !space_after) {
        // Not a whole word: the search goes on after this match, as a leftmost-longest
        // matcher's next match would.
        pos = stop;
        continue;
      }
    }
    if (t.lstrip) {
      size_t s = start;
      while (s > start_offset) {
        const uint32_t cp = code_point_before(text, s);
        if (!is_unicode_whitespace(cp)) break;
        size_t back = s - 1;
        while (back > 0 && (static_cast<unsigned char>(text[back]) & 0xC0) == 0x80) --back;
        s = back;
      }
      start = s;
    }
    if (t.rstrip) {
      size_t e = stop;
      while (e < text.size()) {
        size_t next = e;
        if (!is_unicode_whitespace(next_code_point(text, next))) break;
        e = next;
      }
      stop = e;
    }
    if (start_offset < start) out.push_back(TextPiece{start_offset, start, -1});
    out.push_back(TextPiece{start, stop, t.id});
    start_offset = stop;
    pos = stop;
  }
  if (start_offset < text.size()) out.push_back(TextPiece{start_offset, text.size(), -1});
}

const AddedToken* AddedVocab::find_id(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

int32_t AddedVocab::find_content(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? -1 : it->second;
}

}  // namespace strata::tokenizer
