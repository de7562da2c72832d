// Lexer: splits template source into text and tag tokens the way jinja2's lexer does with
// trim_blocks and lstrip_blocks on (the transformers chat-template environment): `{%-`/`-%}`
// strip whitespace, `{%+`/`+%}` keep it, the first newline after a block or comment tag
// is dropped, and spaces or tabs before a block tag at the start of a line are removed.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata::tokenizer::jinja {

enum class TokenKind : uint8_t {
  kData,        // literal template text (whitespace control already applied)
  kVarBegin,    // {{
  kVarEnd,      // }}
  kBlockBegin,  // {%
  kBlockEnd,    // %}
  kName,
  kString,      // text holds the unescaped value
  kInteger,
  kFloat,
  kOperator,    // text holds the operator: "+", "//", "==", "(", ...
  kEof,
};

struct Token {
  TokenKind kind = TokenKind::kEof;
  std::string text;
  int line = 1;
  int64_t int_value = 0;
  double float_value = 0.0;
};

// Throws Failure on an unterminated tag, comment, string or raw block.
std::vector<Token> tokenize(const std::string& source);

}  // namespace strata::tokenizer::jinja
