// JSON text checked before it is parsed: nesting depth and numbers a double cannot hold.
// nlohmann's parser is iterative but its serializer (error excerpts, the re-parse of tool
// schemas) recurses, so a body of 100,000 nested arrays would overflow the stack later; and
// 1e400 makes the parser throw out_of_range. Both are the client's fault and answer 400
// naming where they are. Every JSON text a client sends (the body, tool-call arguments given
// as strings) and every JSON text a model writes (tool calls) goes through here first.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/api_error.h"

namespace strata::server {

inline constexpr int kDefaultMaxJsonDepth = 256;

// What is wrong with `text` as JSON for a server that allows `max_depth` levels of nesting:
// nullopt when it is within bounds (it may still fail to parse). The error's param is the
// top-level field holding the fault (`root` when the text itself is too deep, or not an object);
// its message names the path (messages[0].content[0]...), the depth and the limit. Strings are
// skipped (with their escapes), so brackets inside them do not count.
std::optional<ApiError> check_json_text(std::string_view text, int max_depth, const std::string& root = "body");

// Parses `text` as JSON after check_json_text. nullopt, with *error set when one is given, when
// it is too deep, holds an out-of-range number or is not JSON.
std::optional<nlohmann::json> parse_json_bounded(std::string_view text, int max_depth, ApiError* error = nullptr,
                                                 const std::string& root = "body");
std::optional<nlohmann::ordered_json> parse_ordered_json_bounded(std::string_view text, int max_depth,
                                                                 ApiError* error = nullptr,
                                                                 const std::string& root = "body");

}  // namespace strata::server
