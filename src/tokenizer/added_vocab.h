// AddedVocab: the added and special tokens of tokenizer.json, found in the text before the
// model runs. Like Hugging Face `tokenizers`, tokens with normalized=false are matched on
// the raw text and the others on the normalized text, leftmost-longest, honoring
// single_word, lstrip and rstrip.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace strata::tokenizer {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  bool single_word = false;
  bool lstrip = false;
  bool rstrip = false;
  bool normalized = true;
  bool special = false;
};

// One piece of split text: [start, end) bytes; `id` >= 0 when it is an added token.
struct TextPiece {
  size_t start;
  size_t end;
  int32_t id;
};

class AddedVocab {
 public:
  // `patterns` holds, per token, the text to search for: the content itself for
  // normalized=false tokens, the normalized content for the others.
  void build(std::vector<AddedToken> tokens, const std::vector<std::string>& patterns);

  // Splits `text` with the raw (normalized=false) or the normalized token set; the pieces
  // cover the whole text in order, empty text gives no pieces.
  void split(std::string_view text, bool normalized_set, std::vector<TextPiece>& out) const;

  const AddedToken* find_id(int32_t id) const;
  int32_t find_content(std::string_view content) const;  // -1 when absent
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // A byte trie over the patterns of one set.
  struct Trie {
    struct Node {
      std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
      int32_t token = -1;                                 // index into tokens_
    };
    std::vector<Node> nodes{Node{}};
    bool first_byte[256] = {};
    void add(std::string_view pattern, int32_t token);
    // Longest pattern starting at text[pos]: (length, token index), or token -1.
    std::pair<size_t, int32_t> longest(std::string_view text, size_t pos) const;
  };

  std::vector<AddedToken> tokens_;
  std::unordered_map<int32_t, size_t> by_id_;
  std::unordered_map<std::string, int32_t> by_content_;
  Trie raw_, normalized_;
};

}  // namespace strata::tokenizer
