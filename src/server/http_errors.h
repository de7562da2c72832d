// Error answers shared by the HTTP server and the supervisor in front of it: the body shape
// follows the route (Anthropic's on /v1/messages, OpenAI's elsewhere).
#pragma once

#include <exception>
#include <string>

#include <httplib.h>

#include "server/api_error.h"

namespace strata::server {

bool is_anthropic_path(const std::string& path);
// Sets the status, Retry-After (429) and the JSON error body of the route's API.
void write_error(const httplib::Request& req, httplib::Response& res, const ApiError& e);
// Logs what a handler threw and answers 500 naming it.
void write_internal_error(const httplib::Request& req, httplib::Response& res, std::exception_ptr ep);

}  // namespace strata::server
