// ApiError: an HTTP error answer in the making. Every failure a client can cause ends here,
// with the status, the field at fault and a message naming the field and the value; the
// renderers produce OpenAI's shape {"error": {message, type, param, code}} or Anthropic's
// {"type": "error", "error": {type, message}}.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace strata::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the request field at fault; "" when none
  std::string code;   // machine-readable detail, "" when none
  int retry_after_s = 0;  // > 0: sent as Retry-After (429)
};

ApiError bad_field(std::string param, std::string message);
// Maps an engine/tokenizer Error: kInvalidArgument/kOutOfRange/kNotFound -> 400,
// kResourceExhausted -> 429, kUnsupported -> 400, anything else -> 500.
ApiError api_error_from(const Error& error, std::string param = "");

// The 401 for a request whose Authorization (Bearer) and x-api-key headers both miss `key`;
// nullopt when one matches or no key is configured.
std::optional<ApiError> check_api_key(const std::string& key, const std::string& authorization,
                                      const std::string& x_api_key);

// Equal strings, compared in time that does not depend on where they differ.
bool secrets_equal(std::string_view a, std::string_view b);

// OpenAI's error type for a status: invalid_request_error, authentication_error, ...
std::string openai_error_type(int status);
std::string anthropic_error_type(int status);

nlohmann::json openai_error_body(const ApiError& e);
nlohmann::json anthropic_error_body(const ApiError& e);

// Where a string stops being valid UTF-8 (overlongs, surrogates and code points past
// U+10FFFF are invalid); nullopt when it is valid throughout.
std::optional<size_t> find_invalid_utf8(std::string_view s);

// A JSON value shortened for an error message (at most ~60 characters).
std::string json_excerpt(const nlohmann::json& v);
// "string", "number", "boolean", "object", "array", "null".
std::string json_type_name(const nlohmann::json& v);
// The 400 for a field of the wrong type: "<field> must be <want>, got <type> <excerpt>".
ApiError wrong_type(const std::string& field, const nlohmann::json& v, const std::string& want);
// Member `key` of an object, or null when it is absent or JSON null.
const nlohmann::json* find_field(const nlohmann::json& object, const char* key);

}  // namespace strata::server
