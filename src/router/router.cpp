#include "router/router.h"

#include <httplib.h>
#include <xxhash.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <nlohmann/json.hpp>

#include "core/log.h"
#include "server/http_listener.h"

namespace strata::router {

using json = nlohmann::json;

namespace {

void append_text(const json& content, std::string& out) {
  if (content.is_string()) {
    out += content.get<std::string>();
  } else if (content.is_array()) {
    for (const auto& part : content) {
      if (part.is_object() && part.contains("text") && part["text"].is_string()) out += part["text"].get<std::string>();
    }
  }
}

bool is_openai_stream_path(const std::string& path) { return path == "/v1/chat/completions" || path == "/v1/completions"; }

std::string error_json(const std::string& message) {
  return json{{"error", {{"message", message}, {"type", "router_error"}}}}.dump();
}

}  // namespace

RouteKey route_key(const std::string& body, const std::string& session_header, int32_t prefix_bytes) {
  RouteKey k;
  k.session = session_header;
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return k;
  if (k.session.empty() && j.contains("session_id") && j["session_id"].is_string()) k.session = j["session_id"].get<std::string>();
  std::string p;
  if (j.contains("model") && j["model"].is_string()) p += j["model"].get<std::string>() + "\n";
  if (j.contains("system")) append_text(j["system"], p);
  if (j.contains("messages") && j["messages"].is_array()) {
    // Up to the first user message: what every later turn of the conversation starts with.
    for (const auto& m : j["messages"]) {
      if (int32_t(p.size()) >= prefix_bytes) break;
      if (!m.is_object()) continue;
      const std::string role = m.contains("role") && m["role"].is_string() ? m["role"].get<std::string>() : "";
      p += role + ":";
      if (m.contains("content")) append_text(m["content"], p);
      p += "\n";
      if (role == "user") break;
    }
  } else if (j.contains("prompt")) {
    const json& pr = j["prompt"];
    if (pr.is_string()) {
      p += pr.get<std::string>();
    } else if (pr.is_array()) {
      for (const auto& x : pr) {
        if (int32_t(p.size()) >= prefix_bytes) break;
        if (x.is_number_integer()) p += std::to_string(x.get<int64_t>()) + ",";
        else if (x.is_string()) { p += x.get<std::string>(); break; }
      }
    }
  }
  if (int32_t(p.size()) > prefix_bytes) p.resize(size_t(prefix_bytes));
  k.prefix = std::move(p);
  return k;
}

std::string ResumeFilter::feed(const char* data, size_t n) {
  buffer_.append(data, n);
  std::string out;
  size_t pos;
  while ((pos = buffer_.find("\n\n")) != std::string::npos) {
    std::string block = buffer_.substr(0, pos);
    buffer_.erase(0, pos + 2);
    out += event(block);
  }
  return out;
}

std::string ResumeFilter::event(const std::string& block) {
  const std::string whole = block + "\n\n";
  if (block.rfind("data: ", 0) != 0) return whole;
  const std::string payload = block.substr(6);
  if (payload == "[DONE]") {
    done_ = true;
    return whole;
  }
  json j = json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("choices") || !j["choices"].is_array() || j["choices"].empty()) {
    return whole;
  }
  json& c = j["choices"][0];
  if (!c.is_object()) return whole;
  const bool chat = c.contains("delta");
  json* text = nullptr;
  if (chat && c["delta"].is_object() && c["delta"].contains("content") && c["delta"]["content"].is_string()) {
    text = &c["delta"]["content"];
  } else if (!chat && c.contains("text") && c["text"].is_string()) {
    text = &c["text"];
  }
  const bool finishing = c.contains("finish_reason") && !c["finish_reason"].is_null();
  std::string piece = text ? text->get<std::string>() : std::string();
  if (resumed_ && !finishing && piece.empty()) return {};  // a replayed role delta: sent already
  const int64_t len = int64_t(piece.size());
  const int64_t left = std::max<int64_t>(0, skip_ - seen_);
  seen_ += len;
  if (left == 0) {
    return whole;
  }
  if (left >= len) {  // replayed text, forwarded before
    if (!finishing) return {};
    *text = "";
    c.erase("logprobs");
    return "data: " + j.dump() + "\n\n";
  }
  *text = piece.substr(size_t(left));  // the replay ends inside this chunk
  c.erase("logprobs");
  return "data: " + j.dump() + "\n\n";
}

Router::Router(RouterOptions options) : options_(std::move(options)) {
  for (const std::string& u : options_.replicas) {
    auto r = std::make_unique<Replica>();
    r->url = u;
    std::string rest = u.rfind("http://", 0) == 0 ? u.substr(7) : u;
    while (!rest.empty() && rest.back() == '/') rest.pop_back();
    const size_t colon = rest.rfind(':');
    r->host = colon == std::string::npos ? rest : rest.substr(0, colon);
    r->port = colon == std::string::npos ? 80 : std::atoi(rest.c_str() + colon + 1);
    replicas_.push_back(std::move(r));
  }
}

Router::~Router() { stop(); }

int Router::pick(const RouteKey& key, const std::vector<int>& exclude) {
  auto excluded = [&](int i) { return std::find(exclude.begin(), exclude.end(), i) != exclude.end(); };
  std::vector<int> cand;
  for (int pass = 0; pass < 2 && cand.empty(); ++pass) {  // all unhealthy: try them anyway
    for (int i = 0; i < int(replicas_.size()); ++i) {
      if (!excluded(i) && (pass == 1 || replicas_[size_t(i)]->healthy.load())) cand.push_back(i);
    }
  }
  if (cand.empty()) return -1;
  int least = cand[0];
  for (int i : cand) {
    if (replicas_[size_t(i)]->in_flight.load() < replicas_[size_t(least)]->in_flight.load()) least = i;
  }
  const std::string& k = key.session.empty() ? key.prefix : key.session;
  if (k.empty()) {
    ++routed_load_;
    return least;
  }
  int best = cand[0];
  uint64_t best_score = 0;
  for (int i : cand) {
    const std::string& url = replicas_[size_t(i)]->url;
    const uint64_t s = XXH3_64bits_withSeed(k.data(), k.size(), XXH3_64bits(url.data(), url.size()));
    if (s >= best_score) {
      best_score = s;
      best = i;
    }
  }
  if (!key.session.empty()) {
    ++routed_session_;
    return best;
  }
  if (replicas_[size_t(best)]->in_flight.load() > replicas_[size_t(least)]->in_flight.load() + options_.load_slack) {
    ++routed_load_;
    return least;
  }
  ++routed_prefix_;
  return best;
}

namespace {

// One request's answer, filled by its upstream thread, drained by the client's connection.
struct Relay {
  std::mutex mu;
  std::condition_variable cv;
  bool head = false;       // status and kind are known
  bool streaming = false;  // an SSE stream: chunks in `out`
  int status = 0;
  std::string content_type, body;
  std::deque<std::string> out;
  bool done = false;
  std::atomic<bool> client_gone{false};
};

}  // namespace

Result<int> Router::start() {
  if (replicas_.empty()) return make_error(ErrorCode::kInvalidArgument, "--replica: at least one replica URL is needed");
  for (const auto& r : replicas_) {
    if (r->host.empty() || r->port <= 0 || r->port > 65535) {
      return make_error(ErrorCode::kInvalidArgument, "--replica '" + r->url + "': expected http://host:port");
    }
  }
  http_ = std::make_unique<httplib::Server>();
  auto proxy = [this](const httplib::Request& req, httplib::Response& res) {
    handle(req.path, req.body, req.get_header_value("X-Session-Id"), req.get_header_value("Authorization"), &res);
  };
  for (const char* path : {"/v1/chat/completions", "/v1/completions", "/v1/messages"}) http_->Post(path, proxy);
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    int up = 0;
    for (const auto& r : replicas_) up += r->healthy.load() ? 1 : 0;
    res.status = up > 0 ? 200 : 503;
    res.set_content(json{{"status", up > 0 ? "ok" : "no replica up"}, {"replicas_up", up}}.dump(), "application/json");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const int r = pick(RouteKey{}, {});
    if (r >= 0) {
      httplib::Client cli(replicas_[size_t(r)]->host, replicas_[size_t(r)]->port);
      cli.set_connection_timeout(2);
      if (auto up = cli.Get("/v1/models")) {
        res.status = up->status;
        res.set_content(up->body, "application/json");
        return;
      }
    }
    res.status = 503;
    res.set_content(error_json("no replica answered"), "application/json");
  });
  server::ListenerLimits limits;
  limits.workers = options_.http_threads;
  limits.max_connections_per_address = 0;
  listener_ = std::make_unique<server::HttpListener>(*http_, limits);
  auto bound = listener_->bind(options_.host, options_.port);
  if (!bound.ok()) return bound.error();
  health_ = std::thread([this] { health_loop(); });
  return bound;
}

void Router::run() { listener_->run(); }

void Router::stop() {
  std::lock_guard<std::mutex> lock(stop_mu_);
  if (stop_.exchange(true)) return;
  if (listener_) listener_->stop();
  if (health_.joinable()) health_.join();
}

void Router::health_loop() {
  while (!stop_.load()) {
    for (auto& r : replicas_) {
      httplib::Client cli(r->host, r->port);
      cli.set_connection_timeout(1);
      cli.set_read_timeout(2);
      auto res = cli.Get("/health");
      const bool up = res && res->status == 200;
      if (up != r->healthy.load()) log::info("router: replica {} is {}", r->url, up ? "up" : "down");
      r->healthy = up;
    }
    for (double t = 0; t < options_.health_interval_s && !stop_.load(); t += 0.05) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

void Router::handle(const std::string& path, const std::string& body, const std::string& session_header,
                    const std::string& auth, void* res_ptr) {
  httplib::Response& res = *static_cast<httplib::Response*>(res_ptr);
  auto relay = std::make_shared<Relay>();
  const RouteKey key = route_key(body, session_header, options_.prefix_bytes);
  // Upstream on a thread of its own, so the client's answer can start streaming at once.
  std::thread([this, relay, key, path, body, session_header, auth] {
    int64_t delivered = 0;  // choice-0 text bytes forwarded to the client
    bool any = false;       // stream bytes forwarded
    std::vector<int> tried;
    std::string last_error = "no replica";
    for (int attempt = 0; attempt < options_.max_attempts && !relay->client_gone.load(); ++attempt) {
      const int ri = pick(key, tried);
      if (ri < 0) break;
      tried.push_back(ri);
      Replica& rep = *replicas_[size_t(ri)];
      if (attempt > 0) ++retries_;
      if (any) ++resumed_;
      ++rep.requests;
      ++rep.in_flight;
      ResumeFilter filter(delivered, any);
      httplib::Client cli(rep.host, rep.port);
      cli.set_connection_timeout(2);
      cli.set_read_timeout(time_t(options_.timeout_s));
      cli.set_write_timeout(30);
      httplib::Request up;
      up.method = "POST";
      up.path = path;
      up.body = body;
      up.set_header("Content-Type", "application/json");
      if (!session_header.empty()) up.set_header("X-Session-Id", session_header);
      if (!auth.empty()) up.set_header("Authorization", auth);
      bool sse = false;
      int status = 0;
      std::string content_type, other;
      up.response_handler = [&](const httplib::Response& r) {
        status = r.status;
        content_type = r.get_header_value("Content-Type");
        sse = status == 200 && content_type.rfind("text/event-stream", 0) == 0;
        if (sse) {
          std::lock_guard<std::mutex> l(relay->mu);
          if (!relay->head) {
            relay->head = true;
            relay->streaming = true;
            relay->status = 200;
            relay->cv.notify_all();
          }
        }
        return true;
      };
      up.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
        if (!sse) {
          other.append(d, n);
          return true;
        }
        std::string out = filter.feed(d, n);
        if (!out.empty()) {
          any = true;
          std::lock_guard<std::mutex> l(relay->mu);
          relay->out.push_back(std::move(out));
          relay->cv.notify_all();
        }
        return !relay->client_gone.load();
      };
      httplib::Response ures;
      httplib::Error err = httplib::Error::Success;
      const bool ok = cli.send(up, ures, err);
      --rep.in_flight;
      delivered = filter.delivered();
      if (relay->client_gone.load()) return;
      if (ok && sse && filter.done()) {
        std::lock_guard<std::mutex> l(relay->mu);
        relay->done = true;
        relay->cv.notify_all();
        return;
      }
      if (ok && !sse) {
        std::lock_guard<std::mutex> l(relay->mu);
        if (!relay->head && status != 502 && status != 503) {  // the replica's answer, as it is
          relay->head = true;
          relay->status = status;
          relay->content_type = content_type.empty() ? "application/json" : content_type;
          relay->body = std::move(other);
          relay->done = true;
          relay->cv.notify_all();
          return;
        }
        last_error = "replica " + rep.url + " answered " + std::to_string(status);
        continue;
      }
      // The replica died (before answering or mid-stream): another one gets the identical request.
      ++rep.failures;
      rep.healthy = false;
      last_error = "replica " + rep.url + " failed: " + httplib::to_string(err);
      log::warn("router: {}; retrying on another replica", last_error);
      if (any && !is_openai_stream_path(path)) break;  // no resume filter for this stream's format
    }
    ++failed_;
    std::lock_guard<std::mutex> l(relay->mu);
    if (!relay->head) {
      relay->head = true;
      relay->status = 503;
      relay->content_type = "application/json";
      relay->body = error_json("no replica could serve the request: " + last_error);
    } else if (relay->streaming) {
      relay->out.push_back("data: " + error_json("the stream was lost: " + last_error) + "\n\n");
    }
    relay->done = true;
    relay->cv.notify_all();
  }).detach();

  std::unique_lock<std::mutex> l(relay->mu);
  relay->cv.wait(l, [&] { return relay->head; });
  if (!relay->streaming) {
    res.status = relay->status;
    res.set_content(relay->body, relay->content_type);
    return;
  }
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider("text/event-stream", [relay](size_t, httplib::DataSink& sink) {
    for (;;) {
      std::deque<std::string> batch;
      bool done;
      {
        std::unique_lock<std::mutex> lk(relay->mu);
        relay->cv.wait_for(lk, std::chrono::milliseconds(100), [&] { return !relay->out.empty() || relay->done; });
        batch.swap(relay->out);
        done = relay->done;
      }
      for (const std::string& s : batch) {
        if (!sink.write(s.data(), s.size())) {
          relay->client_gone = true;
          return false;
        }
      }
      if (done) break;
    }
    sink.done();
    return true;
  });
}

std::string Router::metrics_text() const {
  std::string t;
  t += "# TYPE strata_router_requests_total counter\n";
  t += "strata_router_requests_total{route=\"session\"} " + std::to_string(routed_session_.load()) + "\n";
  t += "strata_router_requests_total{route=\"prefix\"} " + std::to_string(routed_prefix_.load()) + "\n";
  t += "strata_router_requests_total{route=\"load\"} " + std::to_string(routed_load_.load()) + "\n";
  t += "# TYPE strata_router_retries_total counter\nstrata_router_retries_total " + std::to_string(retries_.load()) + "\n";
  t += "# TYPE strata_router_resumed_streams_total counter\nstrata_router_resumed_streams_total " +
       std::to_string(resumed_.load()) + "\n";
  t += "# TYPE strata_router_failed_total counter\nstrata_router_failed_total " + std::to_string(failed_.load()) + "\n";
  t += "# TYPE strata_router_replica_up gauge\n";
  for (const auto& r : replicas_) t += "strata_router_replica_up{replica=\"" + r->url + "\"} " + (r->healthy.load() ? "1" : "0") + "\n";
  t += "# TYPE strata_router_replica_in_flight gauge\n";
  for (const auto& r : replicas_) t += "strata_router_replica_in_flight{replica=\"" + r->url + "\"} " + std::to_string(r->in_flight.load()) + "\n";
  t += "# TYPE strata_router_replica_requests_total counter\n";
  for (const auto& r : replicas_) t += "strata_router_replica_requests_total{replica=\"" + r->url + "\"} " + std::to_string(r->requests.load()) + "\n";
  t += "# TYPE strata_router_replica_failures_total counter\n";
  for (const auto& r : replicas_) t += "strata_router_replica_failures_total{replica=\"" + r->url + "\"} " + std::to_string(r->failures.load()) + "\n";
  return t;
}

}  // namespace strata::router
