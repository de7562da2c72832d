#include "server/request_trace.h"

#include <algorithm>
#include <cmath>

#include "server/api_response.h"

namespace strata::server {

namespace {

double ms_between(RequestTrace::Clock::time_point a, RequestTrace::Clock::time_point b) {
  return std::round(std::chrono::duration<double, std::milli>(b - a).count() * 1000.0) / 1000.0;
}

bool id_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == ':' ||
         c == '-';
}

}  // namespace

std::string accept_request_id(const std::string& header) {
  bool sane = !header.empty() && header.size() <= 128;
  for (char c : header) sane = sane && id_char(c);
  return sane ? header : random_id("req_");
}

std::optional<ApiError> parse_trace_option(const nlohmann::json& body, bool* trace) {
  *trace = false;
  if (!body.is_object()) return std::nullopt;
  auto s = body.find("strata");
  if (s == body.end() || s->is_null()) return std::nullopt;
  if (!s->is_object()) {
    return bad_field("strata", "strata must be an object such as {\"trace\": true}, got " + json_type_name(*s) + " " + json_excerpt(*s));
  }
  auto t = s->find("trace");
  if (t == s->end() || t->is_null()) return std::nullopt;
  if (!t->is_boolean()) {
    return bad_field("strata.trace", "strata.trace must be a boolean, got " + json_type_name(*t) + " " + json_excerpt(*t));
  }
  *trace = t->get<bool>();
  return std::nullopt;
}

void RequestTrace::on_event(const StreamEvent& ev, Clock::time_point t) {
  if (!ev.tokens.empty()) {
    ++n_events_;
    if (!first_token_) first_token_ = t;
  }
  if (ev.final) {
    ended_ = t;
    if (!first_token_) first_token_ = t;  // the first sampled token ended it (EOS)
    usage_ = ev.usage;
    queued_ms_ = ev.queued_ms;
    preemptions_ = ev.preemptions;
  }
}

nlohmann::json RequestTrace::to_json() const {
  nlohmann::json j = {{"request_id", id_}};
  if (submitted_) j["prepare_ms"] = ms_between(arrived_, *submitted_);
  if (submitted_ && first_token_) {
    // The engine times the queue from inside submit(), a little before submitted_: the split
    // is clamped so that queued_ms + prefill_ms == queued_prefill_ms.
    const double both = ms_between(*submitted_, *first_token_);
    j["queued_prefill_ms"] = both;
    if (queued_ms_) {
      const double queued = std::min(both, std::round(*queued_ms_ * 1000.0) / 1000.0);
      j["queued_ms"] = queued;
      j["prefill_ms"] = std::round((both - queued) * 1000.0) / 1000.0;
    }
  }
  if (first_token_ && ended_) j["decode_ms"] = ms_between(*first_token_, *ended_);
  if (ended_) j["total_ms"] = ms_between(arrived_, *ended_);
  j["prompt_tokens"] = usage_.prompt_tokens;
  j["cached_tokens"] = usage_.cached_tokens;
  j["computed_tokens"] = usage_.prompt_tokens - usage_.cached_tokens;
  j["generated_tokens"] = usage_.completion_tokens;
  j["token_events"] = n_events_;
  j["preemptions"] = preemptions_;
  return j;
}

std::string RequestTrace::log_line(const std::string& method, const std::string& path, int status,
                                   const std::string& finish) const {
  std::string s = "request id=" + id_ + " method=" + method + " path=" + path + " status=" + std::to_string(status);
  if (!finish.empty()) s += " finish=" + finish;
  const nlohmann::json j = to_json();
  for (const char* k : {"prompt_tokens", "cached_tokens", "computed_tokens", "generated_tokens", "prepare_ms",
                        "queued_ms", "prefill_ms", "queued_prefill_ms", "decode_ms", "total_ms", "preemptions"}) {
    if (j.contains(k)) s += std::string(" ") + k + "=" + j[k].dump();
  }
  return s;
}

}  // namespace strata::server
