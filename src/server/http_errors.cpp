#include "server/http_errors.h"

#include <nlohmann/json.hpp>

#include "core/log.h"

namespace strata::server {

bool is_anthropic_path(const std::string& path) { return path == "/v1/messages" || path == "/v1/messages/count_tokens"; }

void write_error(const httplib::Request& req, httplib::Response& res, const ApiError& e) {
  using json = nlohmann::json;
  res.status = e.status;
  if (e.retry_after_s > 0) res.set_header("Retry-After", std::to_string(e.retry_after_s));
  const json body = is_anthropic_path(req.path) ? anthropic_error_body(e) : openai_error_body(e);
  res.set_content(body.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

void write_internal_error(const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
  std::string what = "unknown";
  try {
    std::rethrow_exception(ep);
  } catch (const std::exception& e) {
    what = e.what();
  } catch (...) {
  }
  log::error("{} {}: {}", req.method, req.path, what);
  ApiError e;
  e.status = 500;
  e.message = "internal error: " + what;
  write_error(req, res, e);
}

}  // namespace strata::server
