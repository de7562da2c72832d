#include "server/api_error.h"

#include <strings.h>

namespace strata::server {

ApiError bad_field(std::string param, std::string message) {
  ApiError e;
  e.status = 400;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

ApiError api_error_from(const Error& error, std::string param) {
  ApiError e;
  e.message = error.message;
  e.param = std::move(param);
  switch (error.code) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kOutOfRange:
    case ErrorCode::kNotFound:
    case ErrorCode::kUnsupported:
      e.status = 400;
      break;
    case ErrorCode::kResourceExhausted:
      e.status = 429;
      e.retry_after_s = 1;
      break;
    default:
      e.status = 500;
      break;
  }
  return e;
}

// Time that depends only on the lengths, so a key cannot be guessed byte by byte.
bool secrets_equal(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

namespace {

// The credentials of "Bearer KEY" (the scheme is case-insensitive, RFC 9110 11.1); "" otherwise.
std::string_view bearer_token(std::string_view authorization) {
  constexpr std::string_view kScheme = "bearer ";
  while (!authorization.empty() && authorization.front() == ' ') authorization.remove_prefix(1);
  if (authorization.size() <= kScheme.size() || strncasecmp(authorization.data(), kScheme.data(), kScheme.size()) != 0) {
    return {};
  }
  authorization.remove_prefix(kScheme.size());
  while (!authorization.empty() && authorization.front() == ' ') authorization.remove_prefix(1);
  while (!authorization.empty() && authorization.back() == ' ') authorization.remove_suffix(1);
  return authorization;
}

}  // namespace

std::optional<ApiError> check_api_key(const std::string& key, const std::string& authorization,
                                      const std::string& x_api_key) {
  if (key.empty()) return std::nullopt;
  const std::string_view bearer = bearer_token(authorization);
  if ((!bearer.empty() && secrets_equal(bearer, key)) || (!x_api_key.empty() && secrets_equal(x_api_key, key))) {
    return std::nullopt;
  }
  ApiError e;
  e.status = 401;
  e.code = "invalid_api_key";
  e.message = authorization.empty() && x_api_key.empty() ? "missing API key: send Authorization: Bearer <key>"
                                                         : "invalid API key";
  return e;
}

std::string openai_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "invalid_request_error";
    case 429: return "rate_limit_error";
    case 503: return "service_unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
  }
}

std::string anthropic_error_type(int status) {
  switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

nlohmann::json openai_error_body(const ApiError& e) {
  nlohmann::json err = {{"message", e.message}, {"type", openai_error_type(e.status)}};
  err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  err["code"] = e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code);
  return {{"error", err}};
}

nlohmann::json anthropic_error_body(const ApiError& e) {
  return {{"type", "error"}, {"error", {{"type", anthropic_error_type(e.status)}, {"message", e.message}}}};
}

std::optional<size_t> find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0;
    if (c >= 0xC2 && c <= 0xDF) len = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, cp = c & 0x07;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if ((len == 3 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) {
      return i;
    }
    i += len;
  }
  return std::nullopt;
}

std::string json_excerpt(const nlohmann::json& v) {
  std::string s = v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  if (s.size() > 60) {
    size_t cut = 57;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
    s = s.substr(0, cut) + "...";
  }
  return s;
}

std::string json_type_name(const nlohmann::json& v) {
  if (v.is_number()) return "number";
  return v.type_name();
}

ApiError wrong_type(const std::string& field, const nlohmann::json& v, const std::string& want) {
  return bad_field(field, field + " must be " + want + ", got " + json_type_name(v) + " " + json_excerpt(v));
}

const nlohmann::json* find_field(const nlohmann::json& object, const char* key) {
  auto it = object.find(key);
  if (it == object.end() || it->is_null()) return nullptr;
  return &*it;
}

}  // namespace strata::server
