// JSON Schema (draft 2020-12 as clients send it, draft 7 spellings accepted) and any-JSON
// grammars. What each keyword does here is listed in json_schema_keywords(); a keyword outside
// that table is an error naming it and its location, never dropped.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "sampling/grammar/ir.h"

namespace strata::grammar {

enum class JsonWhitespace {
  kCompact,   // no whitespace at all: {"a":1,"b":[1,2]} (the default, as xgrammar's compact)
  kFlexible,  // any JSON whitespace ([ \t\n\r]*) around structural characters
};

struct JsonSchemaOptions {
  // OpenAI strict: every property required, no properties beyond `properties`, schema order.
  // Without it: optional properties may be absent, and other properties may appear (between
  // the declared ones, keyed by any name not declared) unless additionalProperties is false.
  bool strict = false;
  JsonWhitespace whitespace = JsonWhitespace::kCompact;
  // Literal bytes before and after the JSON value (a tool-call format's markers, e.g.
  // "<tool_call>\n" and "\n</tool_call>"); empty: none.
  std::string prefix, suffix;
};

Result<std::shared_ptr<const Grammar>> compile_json_schema(std::string_view schema_text,
                                                           const JsonSchemaOptions& options,
                                                           const Limits& limits = {});
// Any JSON object (OpenAI response_format json_object).
Result<std::shared_ptr<const Grammar>> compile_json_object(JsonWhitespace whitespace = JsonWhitespace::kCompact,
                                                           const Limits& limits = {});

// The coverage table: each keyword, and what it does here.
struct KeywordSupport {
  const char* keyword;
  const char* support;  // "supported", "ignored (annotation)", "error", or a restriction
};
const std::vector<KeywordSupport>& json_schema_keywords();

}  // namespace strata::grammar
