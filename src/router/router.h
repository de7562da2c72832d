// Router: an HTTP front over strata replicas (`strata router --replica URL ...`).
//
// Each request goes to one replica, chosen by rendezvous hashing of a key over the healthy
// replicas: the session (body "session_id" or the X-Session-Id header) when there is one, so a
// conversation stays where its KV is; else the leading bytes of the prompt (system prompt and a
// conversation's first user message: what its later turns start with; for a plain prompt, its
// leading bytes), so requests sharing a prefix meet on the replica that holds it. A prefix choice
// gives way to the least loaded replica when it has more than `load_slack` requests in flight
// beyond it (load: the router's own count per replica). Health: GET /health of every replica
// every health_interval_s; a replica failing it, or refusing a connection, is skipped until it
// answers again. Responses pass through unbuffered (SSE streams chunk by chunk). A replica that
// fails before answering is retried on another; one that dies mid-stream of an OpenAI route is
// re-sent the identical request on another replica, which resumes from its checkpoint in the
// shared store (--checkpoint-store redis) and replays what was generated: the router skips the
// text it already forwarded, so no token is missing or repeated. /metrics: routing decisions,
// retries, per-replica health and load.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"

namespace httplib {
class Server;
}

namespace strata::server {
class HttpListener;
}

namespace strata::router {

struct RouterOptions {
  std::vector<std::string> replicas;  // http://host:port
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port
  double health_interval_s = 1.0;
  int32_t max_attempts = 3;       // replicas tried per request
  int32_t prefix_bytes = 512;     // leading prompt bytes that key prefix routing, at most
  int32_t load_slack = 4;         // in-flight requests a prefix choice may carry over the least loaded
  double timeout_s = 600.0;       // per upstream request
  int http_threads = 64;
};

// What routes a request: its session (empty: none) and its prompt prefix.
struct RouteKey {
  std::string session;
  std::string prefix;
};
// From a request body (OpenAI chat/completions, Anthropic messages) and its X-Session-Id header.
RouteKey route_key(const std::string& body, const std::string& session_header, int32_t prefix_bytes);

// Drops from an SSE stream of an OpenAI route the text already forwarded (a retried request
// replays it): events are passed, cut or dropped so the output continues after `skip_chars`
// bytes of choice-0 text. Other events pass unchanged, except a replayed role-only delta.
class ResumeFilter {
 public:
  explicit ResumeFilter(int64_t skip_chars, bool resumed) : skip_(skip_chars), resumed_(resumed) {}
  // Feeds upstream bytes; returns what to forward now.
  std::string feed(const char* data, size_t n);
  // Choice-0 text bytes the client has now, in total (the skipped ones included).
  int64_t delivered() const { return std::max(skip_, seen_); }
  bool done() const { return done_; }  // [DONE] passed

 private:
  std::string event(const std::string& block);
  std::string buffer_;
  int64_t skip_;
  bool resumed_;
  int64_t seen_ = 0;  // choice-0 text bytes of this stream so far
  bool done_ = false;
};

class Router {
 public:
  explicit Router(RouterOptions options);
  ~Router();
  // Binds (the error names the address) and starts the health checks; returns the port.
  Result<int> start();
  void run();   // serves until stop()
  void stop();

  // The replica for key among those healthy and not in `exclude` (-1: none).
  int pick(const RouteKey& key, const std::vector<int>& exclude);
  std::string metrics_text() const;

 private:
  struct Replica {
    std::string url, host;
    int port = 0;
    std::atomic<bool> healthy{true};
    std::atomic<int64_t> in_flight{0};
    std::atomic<int64_t> requests{0};
    std::atomic<int64_t> failures{0};
  };
  void health_loop();
  void handle(const std::string& path, const std::string& body, const std::string& session_header,
              const std::string& api_key, void* res);

  RouterOptions options_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<server::HttpListener> listener_;
  std::thread health_;
  std::mutex stop_mu_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> routed_session_{0}, routed_prefix_{0}, routed_load_{0}, retries_{0}, resumed_{0}, failed_{0};
};

}  // namespace strata::router
