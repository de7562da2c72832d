// Server metrics: HTTP-side counters (requests by endpoint and status, token totals from
// final usages) and the Prometheus text of /metrics, which adds the engine's statistics
// (queue depth, KV blocks, TTFT and inter-token latency histograms, preemptions).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "engine/request.h"

namespace strata::server {

class ServerMetrics {
 public:
  void count_request(const std::string& endpoint, int status);
  void count_usage(const Usage& usage);
  void count_disconnect() { std::lock_guard<std::mutex> l(mu_); ++disconnects_; }

  struct Snapshot {
    std::map<std::pair<std::string, int>, int64_t> requests;  // (endpoint, status) -> count
    int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
    int64_t disconnects = 0;
    int64_t rejected_connections = 0;  // answered by the listener before a worker read them
  };
  Snapshot snapshot() const;

 private:
  mutable std::mutex mu_;
  Snapshot s_;
  int64_t disconnects_ = 0;
};

// The Prometheus text exposition (version 0.0.4) of both.
std::string render_metrics(const ServerMetrics::Snapshot& server, const EngineStats& engine, const std::string& model_name);

}  // namespace strata::server
