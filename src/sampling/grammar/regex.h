// Regular expressions (an ECMAScript subset) lowered into the grammar IR over UTF-8: literals,
// escapes (\d \w \s \D \W \S \t \n \r \f \v \0 \xHH \uHHHH \u{H..}, escaped punctuation), classes
// ([a-z], [^...]), `.`, groups ((...), (?:...), (?<name>...)), alternation, quantifiers (* + ?
// {m} {m,} {m,n}, lazy forms accepted), and ^ / $ at the ends of the pattern or of a top-level
// alternative. `.` and classes match whole code points. Backreferences, lookaround and word
// boundaries are refused naming the construct.
#pragma once

#include <string_view>

#include "core/status.h"
#include "sampling/grammar/ir.h"

namespace strata::grammar {

struct RegexMode {
  // Emit the match as the inside of a JSON string: `"`, `\` and control characters appear in
  // their escaped forms (\" \\ \n \u00XX ...).
  bool json_string = false;
  // JSON Schema `pattern` semantics: the regex may match anywhere unless anchored by ^ / $.
  bool search = false;
};

// Lowers `pattern` to an expression of `b`. Errors name the construct and its offset.
Result<ExprId> regex_to_expr(GrammarBuilder& b, std::string_view pattern, const RegexMode& mode);

// One JSON string character (unescaped code point or escape sequence), inside the quotes.
ExprId json_string_char(GrammarBuilder& b);

}  // namespace strata::grammar
