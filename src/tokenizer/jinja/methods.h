// Methods: the Python str, dict and list methods a chat template may call
// (`content.startswith(...)`, `message.get('x')`, `d.items()`), bound to their receiver.
// Mutating methods are refused as jinja2's ImmutableSandboxedEnvironment refuses them.
#pragma once

#include <optional>
#include <string>

#include "tokenizer/jinja/value.h"

namespace strata::tokenizer::jinja {

// The bound method `name` of `obj`, or nothing when the type has no such method.
std::optional<Value> find_method(const Value& obj, const std::string& name);

// Python's printf-style `fmt % args` (also the `format` filter).
std::string percent_format(const std::string& fmt, const Value& args);
// Python's str.format(*args, **kwargs) for plain replacement fields.
std::string brace_format(const std::string& fmt, const CallArgs& args);

}  // namespace strata::tokenizer::jinja
