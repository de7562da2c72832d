// JSON in and out of the interpreter: context values arrive as nlohmann::ordered_json
// (key order kept, as Python dicts keep it) and `tojson` writes Python's json.dumps text.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "tokenizer/jinja/value.h"

namespace strata::tokenizer::jinja {

Value from_json(const nlohmann::ordered_json& j);

struct JsonDumpOptions {
  std::optional<std::string> indent;  // absent: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool ensure_ascii = false;
  bool sort_keys = false;
};

// Python json.dumps(value, ...). Throws Failure for values JSON cannot hold (undefined,
// callables) like json.dumps raises TypeError.
std::string dump_json(const Value& v, const JsonDumpOptions& options);

}  // namespace strata::tokenizer::jinja
