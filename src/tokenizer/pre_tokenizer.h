// Pre-tokenizers of tokenizer.json: Split (regex via PCRE2 or literal, all five delimiter
// behaviors, invert), ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, Sequence.
// They cut a normalized segment into the words the BPE model encodes one by one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace strata::tokenizer {

class PreTokenizer {
 public:
  virtual ~PreTokenizer() = default;
  // Replaces `words` by their pieces; empty pieces are dropped. `at_text_start` is true for
  // the segment that begins the input (Metaspace prepend_scheme "first").
  virtual void pre_tokenize(std::vector<std::string>& words, bool at_text_start) const = 0;
  // True when the words it emits are raw bytes the model must read through the GPT-2
  // byte alphabet (a ByteLevel stage ran last); words then stay raw for speed.
  virtual bool byte_level() const { return false; }
};

// Builds the pre-tokenizer a tokenizer.json "pre_tokenizer" value describes (null gives
// nullptr). A ByteLevel stage must come last in a Sequence.
Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const nlohmann::json& spec);

// The SentencePiece-style Metaspace stage, also built directly by the transformers 5
// compatibility mode (see LoadOptions in tokenizer.h).
enum class PrependScheme { kAlways, kFirst, kNever };
std::unique_ptr<PreTokenizer> make_metaspace(const std::string& replacement, PrependScheme scheme, bool split);

}  // namespace strata::tokenizer
