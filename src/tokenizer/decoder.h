// Decoders of tokenizer.json: ByteLevel, Metaspace, ByteFallback, Fuse, Strip, Replace,
// Sequence. Like Hugging Face `tokenizers`, each maps the list of token strings to a new
// list (decode_chain) and the final list is concatenated.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace strata::tokenizer {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens) const = 0;
};

// Builds the decoder a tokenizer.json "decoder" value describes; null gives nullptr.
Result<std::unique_ptr<Decoder>> parse_decoder(const nlohmann::json& spec);

// The decoder transformers 5's LlamaTokenizer installs (see LoadOptions in tokenizer.h).
std::unique_ptr<Decoder> make_llama_decoder();

}  // namespace strata::tokenizer
