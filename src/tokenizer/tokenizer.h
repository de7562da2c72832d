// Tokenizer: a Hugging Face tokenizer directory (tokenizer.json + tokenizer_config.json, and
// chat_template.jinja / generation_config.json when present), encoding and decoding exactly
// as the `tokenizers` library does for BPE models: byte-level (Llama 3, Qwen, DeepSeek,
// gpt-oss) and SentencePiece-style with byte fallback (Llama 2, Gemma).
//
// Pipeline of encode(): added/special tokens are cut out of the raw text, the rest is
// normalized, cut again on the normalized added tokens, pre-tokenized into words, and each
// word is merged by the BPE model; the post-processor adds BOS/EOS when asked.
//
// Ownership: Tokenizer is a cheap handle over immutable shared state. Copies share it, and
// every const method is safe to call from many threads at once.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace strata::tokenizer {

struct LoadOptions {
  // transformers 5 replaces the pipeline of tokenizer.json when tokenizer_config.json names
  // LlamaTokenizer(Fast): no normalizer, a Metaspace pre-tokenizer that does not split,
  // byte fallback, and the ▁/ByteFallback/Fuse/Strip decoder. For byte-level vocabularies
  // that declare this class (DeepSeek V3) it drops every space and non-ASCII letter, a
  // known transformers 5 regression. Off by default: strata follows tokenizer.json as the
  // `tokenizers` library does. On, it reproduces what transformers 5 AutoTokenizer returns.
  bool transformers5_llama_rebuild = false;
};

class Tokenizer {
 public:
  // Loads `dir`/tokenizer.json (required), tokenizer_config.json, chat_template.jinja and
  // generation_config.json (optional). Errors name the file and the field.
  static Result<Tokenizer> load(const std::string& dir, const LoadOptions& options = {});
  // The same from file contents (tokenizer_config_json may be empty).
  static Result<Tokenizer> from_json(const std::string& tokenizer_json, const std::string& tokenizer_config_json,
                                     const LoadOptions& options = {});

  // Ids of `text`; `add_special` adds the post-processor's tokens (BOS, ...). Special
  // tokens written in the text are always recognized. Invalid UTF-8 is an Error naming the
  // byte offset.
  Result<std::vector<int32_t>> encode(std::string_view text, bool add_special) const;

  // Text of `ids`; ids outside the vocabulary are skipped, `skip_special` drops special
  // tokens. Invalid byte sequences become U+FFFD.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const;
  std::string decode(const int32_t* ids, size_t n, bool skip_special) const;

  std::string id_to_piece(int32_t id) const;         // "" for an unknown id
  // The bytes token `id` adds to generated text, for grammar vocabularies: a byte-level piece
  // mapped back to its bytes (partial UTF-8 kept), a <0xNN> byte-fallback piece as that byte,
  // "▁" as a space; an added token as its content. "" for an unknown id.
  std::string token_bytes(int32_t id) const;
  int32_t piece_to_id(std::string_view piece) const;  // -1 when absent
  int32_t vocab_size() const;                         // largest id + 1, added tokens included
  bool is_special(int32_t id) const;

  int32_t bos_id() const;  // tokenizer_config bos_token, -1 when it names none
  int32_t eos_id() const;  // tokenizer_config eos_token, -1 when it names none
  const std::string& bos_token() const;  // "" when none
  const std::string& eos_token() const;

  // Chat template source: "default" is chat_template.jinja when present, else
  // tokenizer_config.json chat_template (a string, or the entry named "default" of a list
  // of {name, template}). NotFound when there is none by that name.
  Result<std::string> chat_template_source(const std::string& name = "default") const;
  std::vector<std::string> chat_template_names() const;

  // eos_token_id of generation_config.json (empty when absent).
  const std::vector<int32_t>& generation_eos_ids() const;

  // Ids that end a generation: `generation_config_eos`, the tokenizer's EOS, and each
  // end-of-turn token (<|eot_id|>, <|im_end|>, <end_of_turn>, <|end|>, <|return|>,
  // <｜end▁of▁sentence｜>, ...) that is a special token and appears in a chat template.
  std::vector<int32_t> stop_ids(const std::vector<int32_t>& generation_config_eos) const;
  std::vector<int32_t> stop_ids() const { return stop_ids(generation_eos_ids()); }

  struct State;

 private:
  explicit Tokenizer(std::shared_ptr<const State> state) : state_(std::move(state)) {}
  std::shared_ptr<const State> state_;
};

}  // namespace strata::tokenizer
