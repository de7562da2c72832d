// BpeModel: the BPE model of tokenizer.json. Byte-level vocabularies (GPT-2 alphabet) and
// SentencePiece-style ones (`▁`, `<0xXX>` byte fallback, unk fusing) share one merge loop:
// a linked list of symbols and a min-heap of candidate merges ordered by (rank, position),
// exactly the order Hugging Face `tokenizers` merges in. Words are cached (word -> ids).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace strata::tokenizer {

class WordCache;

class BpeModel {
 public:
  BpeModel();
  ~BpeModel();
  BpeModel(BpeModel&&) noexcept;
  BpeModel& operator=(BpeModel&&) noexcept;

  // Builds from a tokenizer.json "model" object of type BPE. Merges may be "a b" strings or
  // ["a", "b"] pairs; a merge naming a token outside the vocabulary is an Error.
  static Result<BpeModel> from_json(const nlohmann::json& model);

  using VocabEntries = std::vector<std::pair<std::string, int64_t>>;
  using MergeEntries = std::vector<std::pair<std::string, std::string>>;
  // The same from the model's settings (`model` without vocab and merges) and the vocab and
  // merges pulled out while parsing, which spares building a JSON tree of 100k+ entries.
  static Result<BpeModel> build(const nlohmann::json& model, VocabEntries vocab, MergeEntries merges);

  // Appends the ids of one pre-tokenized word. `byte_level`: the word is raw bytes, read
  // through the GPT-2 byte alphabet. Thread-safe.
  void encode_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view token) const;  // -1 when absent
  // The vocabulary string of `id`, or nullptr when the model has no such id.
  const std::string* id_to_token(int32_t id) const;
  int32_t max_id() const { return static_cast<int32_t>(pieces_.size()) - 1; }

  // The transformers 5 LlamaTokenizer rebuild turns these on (see LoadOptions).
  void set_byte_fallback(bool on) { byte_fallback_ = on; }
  void set_fuse_unk(bool on) { fuse_unk_ = on; }

 private:
  struct MergeTable;

  void merge_word(std::string_view word, bool byte_level, std::vector<int32_t>& out) const;
  // Initial symbol id of one character (its UTF-8 bytes), or -1.
  int32_t char_id(std::string_view ch) const;

  std::vector<std::string> pieces_;  // id -> token string ("" for unused ids)
  // Open-addressing index of pieces_: slot -> id (-1 empty), probed from the string's hash.
  std::vector<int32_t> index_;
  size_t index_mask_ = 0;
  std::unique_ptr<MergeTable> merges_;
  int32_t byte_ids_[256];            // byte -> id of its GPT-2 character, or -1
  int32_t fallback_ids_[256];        // byte -> id of "<0xXX>", or -1
  bool all_fallback_bytes_ = false;  // every "<0xXX>" token exists
  int32_t unk_id_ = -1;
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;
  std::unique_ptr<WordCache> cache_;
};

}  // namespace strata::tokenizer
