// TokenizerConfig: what strata reads from tokenizer_config.json and generation_config.json
// (special token strings, chat templates, the class transformers would build, EOS ids).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace strata::tokenizer {

struct TokenizerConfig {
  std::string bos_token;  // "" when null or absent; AddedToken dicts give their content
  std::string eos_token;
  std::string tokenizer_class;
  bool add_prefix_space = true;  // transformers' LlamaTokenizer defaults
  bool legacy = true;
  std::vector<std::pair<std::string, std::string>> chat_templates;  // (name, source)
  std::vector<int32_t> generation_eos_ids;

  const std::string* find_template(const std::string& name) const;
  // Adds or replaces the template called `name`.
  void set_template(const std::string& name, std::string source);
};

Result<TokenizerConfig> parse_tokenizer_config(const std::string& text);
// Reads eos_token_id (an int or a list) into `config`.
Status parse_generation_config(const std::string& text, TokenizerConfig& config);

}  // namespace strata::tokenizer
