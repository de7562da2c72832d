// Built-in filters and tests of jinja2 (plus transformers' `tojson`), applied by name.
// Unknown names are rejected when the template is parsed, as jinja2 rejects them when it
// compiles the template.
#pragma once

#include <string>

#include "tokenizer/jinja/value.h"

namespace strata::tokenizer::jinja {

bool is_known_filter(const std::string& name);
bool is_known_test(const std::string& name);

// `value | name(args)`.
Value apply_filter(const std::string& name, const Value& value, const CallArgs& args);
// `value is name(args)`.
bool apply_test(const std::string& name, const Value& value, const CallArgs& args);

}  // namespace strata::tokenizer::jinja
