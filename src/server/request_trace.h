// Per-request traces: the X-Request-Id every answer carries (the client's when it is sane, else
// a fresh one), and for a generation the times and token counts the server sees: from arrival
// to submission (template and tokenization), submission to the first token (queued_prefill_ms),
// split by the engine's report of the step that first scheduled the request into queued_ms and
// prefill_ms, the first token to the end (decoding), preemptions, and the prompt's cached and
// computed tokens. One structured log line per request; under usage.strata when the request sets
// "strata": {"trace": true}.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/api_error.h"

namespace strata::server {

inline constexpr const char* kRequestIdHeader = "X-Request-Id";

// The client's id when it is 1..128 characters of [A-Za-z0-9._:-], else a fresh "req_..." one.
std::string accept_request_id(const std::string& header);

// "strata": {"trace": bool} in a request body; an error names strata or strata.trace.
std::optional<ApiError> parse_trace_option(const nlohmann::json& body, bool* trace);

class RequestTrace {
 public:
  using Clock = std::chrono::steady_clock;

  explicit RequestTrace(std::string id, Clock::time_point arrived = Clock::now()) : id_(std::move(id)), arrived_(arrived) {}

  const std::string& id() const { return id_; }
  void submitted(Clock::time_point t = Clock::now()) { submitted_ = t; }
  // Every event of the request's stream, in order.
  void on_event(const StreamEvent& ev, Clock::time_point t = Clock::now());

  // {"request_id", "queued_ms", "prefill_ms", ...}: what usage.strata.trace shows.
  nlohmann::json to_json() const;
  // key=value pairs for the log: "request id=... path=... status=... ttft_ms=...".
  std::string log_line(const std::string& method, const std::string& path, int status, const std::string& finish) const;

 private:
  std::string id_;
  Clock::time_point arrived_;
  std::optional<Clock::time_point> submitted_, first_token_, ended_;
  Usage usage_;
  std::optional<double> queued_ms_;  // the final event's: submit to the first scheduled step
  int32_t preemptions_ = 0;
  int64_t n_events_ = 0;  // token events
};

}  // namespace strata::server
