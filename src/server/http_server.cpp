#include "server/http_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <filesystem>

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>

#include "core/log.h"
#include "server/api_response.h"
#include "server/connection_watch.h"
#include "server/embeddings.h"
#include "server/http_errors.h"
#include "server/http_listener.h"
#include "server/json_guard.h"
#include "server/output_assembler.h"
#include "server/request_trace.h"
#include "server/responses_api.h"
#include "server/status_page.h"
#include "server/supervisor.h"

namespace strata::server {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::system_clock;

constexpr auto kPoll = std::chrono::milliseconds(100);

void write_json(httplib::Response& res, const json& j) {
  res.status = 200;
  res.set_content(j.dump(-1, ' ', false, json::error_handler_t::replace), "application/json");
}

// Parses a request body: UTF-8 first (so the message names the offset), then its nesting and
// numbers (json_guard.h), then JSON.
std::optional<ApiError> parse_body(const std::string& body, int max_depth, json* out) {
  if (auto bad = find_invalid_utf8(body)) {
    return bad_field("body", "request body is not valid UTF-8 (byte offset " + std::to_string(*bad) + ")");
  }
  if (auto e = check_json_text(body, max_depth)) return e;
  try {
    *out = json::parse(body);
  } catch (const json::exception& e) {
    return bad_field("body", std::string("request body is not valid JSON: ") + e.what());
  }
  return std::nullopt;
}

std::string id_prefix(ApiKind k) {
  switch (k) {
    case ApiKind::kChat: return "chatcmpl-";
    case ApiKind::kCompletion: return "cmpl-";
    case ApiKind::kResponses: return "resp_";
    default: return "msg_";
  }
}

// One generation in flight: the engine stream and everything that shapes its answer.
struct Generation {
  std::shared_ptr<RequestStream> stream;
  std::unique_ptr<OutputAssembler> assembler;
  std::unique_ptr<ResponseBuilder> builder;
  int fd = -1;  // the client's socket, for noticing that it went away
  std::function<void()> on_complete;  // after a finish that is not an error, before its text is sent
  std::optional<RequestTrace> trace;
  bool trace_in_usage = false;  // "strata": {"trace": true}
  std::string method, path;     // for the log line
  bool cancel_sent = false;
  bool stop_string = false;

  // Feeds one event; returns its SSE text. Sets *final on the last event.
  std::string feed(const StreamEvent& ev, bool* final, FinishState* fin) {
    std::string out;
    if (trace) trace->on_event(ev);
    if (!ev.prompt_logprobs.empty()) builder->prompt_logprobs(ev.prompt_logprobs);
    if (!ev.tokens.empty()) {
      OutputDelta d = assembler->push(ev.tokens, ev.logprobs);
      out += builder->delta(d);
      if (assembler->stopped() && !cancel_sent) {
        stop_string = true;
        cancel_sent = true;
        stream->cancel();  // the stop string ended it: free the sequence now
      }
    }
    if (ev.final) {
      *final = true;
      fin->reason = ev.finish_reason;
      fin->stop_string = stop_string;
      fin->usage = ev.usage;
      if (stop_string) {
        // The engine sampled on until it saw the cancel; the tokens past the stop string are
        // not part of the answer.
        fin->stop_sequence = assembler->stop_sequence();
        fin->usage.completion_tokens = assembler->n_tokens();
      }
      fin->stop_token = ev.stop_token;
      fin->error = ev.message;
    }
    return out;
  }

  // The end of a generation that did not fail: its closing text (with the trace under usage when
  // asked, after storing what on_complete stores), and its log line.
  std::string complete(const FinishState& fin) {
    std::vector<ToolCall> calls;
    OutputDelta last = assembler->finish(&calls);
    if (trace_in_usage && trace) builder->set_usage_extension("strata", {{"trace", trace->to_json()}});
    std::string tail = builder->finish(last, calls, fin);
    if (on_complete) on_complete();
    log_end(200, fin);
    return tail;
  }

  void log_end(int status, const FinishState& fin) const {
    if (trace) log::info("{}", trace->log_line(method, path, status, fin.stop_string ? "stop" : finish_reason_name(fin.reason)));
  }
};

// The X-Strata-* headers of a supervising process (supervisor.h); empty when absent or malformed.
struct SupervisedHeaders {
  std::optional<uint64_t> seed;
  std::string response_id;
  std::optional<int64_t> created;
  bool stream_parts = false;
};

SupervisedHeaders read_supervised_headers(const httplib::Request& req) {
  SupervisedHeaders h;
  try {
    if (req.has_header(kSeedHeader)) h.seed = std::stoull(req.get_header_value(kSeedHeader));
    if (req.has_header(kCreatedHeader)) h.created = std::stoll(req.get_header_value(kCreatedHeader));
  } catch (const std::exception&) {
    log::warn("ignoring a malformed {} or {} header", kSeedHeader, kCreatedHeader);
  }
  h.response_id = req.get_header_value(kResponseIdHeader);
  h.stream_parts = req.get_header_value(kStreamPartsHeader) == "1";
  return h;
}

// A stream for the supervising process: every token is assembled on its own and its SSE text
// is followed by a part marker (": strata-part token N", N counting generated tokens), the
// opening text by "start" and the closing text by "end". The text of token N depends only on
// tokens 1..N, so a resumed request, which replays its checkpointed tokens, produces the same
// parts and the supervisor skips those its client already has. A stream cut by a dead engine
// ends with "lost" and no closing events, so the supervisor re-sends it.
bool stream_parts(Generation& gen, httplib::DataSink& sink, Engine& engine, ServerMetrics& metrics) {
  auto write = [&](const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); };
  auto part = [](const std::string& label) { return std::string(kPartPrefix) + label + "\n\n"; };
  auto vanish = [&] {
    if (!gen.cancel_sent) {
      gen.cancel_sent = true;
      gen.stream->cancel();
      metrics.count_disconnect();
    }
    return false;
  };
  if (!write(gen.builder->start() + part("start"))) return vanish();
  FinishState fin;
  bool final = false;
  int64_t n_tokens = 0;
  while (!final) {
    auto ev = gen.stream->next(kPoll);
    if (!ev) {
      if (peer_closed(gen.fd)) return vanish();
      continue;
    }
    if (!ev->prompt_logprobs.empty()) gen.builder->prompt_logprobs(ev->prompt_logprobs);
    const bool with_logprobs = ev->logprobs.size() == ev->tokens.size();
    for (size_t i = 0; i < ev->tokens.size(); ++i) {
      StreamEvent one;
      one.tokens = {ev->tokens[i]};
      if (with_logprobs) one.logprobs = {ev->logprobs[i]};
      bool unused = false;
      const std::string text = gen.feed(one, &unused, &fin);
      if (!write(text + part("token " + std::to_string(++n_tokens)))) return vanish();
    }
    if (ev->final) {
      StreamEvent end = std::move(*ev);
      end.tokens.clear();
      end.logprobs.clear();
      end.prompt_logprobs.clear();
      gen.feed(end, &final, &fin);
    }
  }
  if (fin.reason == FinishReason::kError && !fin.stop_string && !engine.alive()) {
    write(part("lost"));
    return false;
  }
  metrics.count_usage(fin.usage);
  std::string tail;
  if (fin.reason == FinishReason::kError && !fin.stop_string) {
    ApiError e;
    e.status = 500;
    e.message = "generation failed: " + fin.error;
    tail = gen.builder->stream_error(e);
    gen.log_end(500, fin);
  } else {
    tail = gen.complete(fin);
  }
  write(tail + part("end"));
  sink.done();
  return true;
}

// n > 1 or best_of (chat and completions): one engine request per choice, each with its own
// assembler and builder. Choice 0 goes first; the others are submitted once it has sampled its
// first token, so its prompt's full blocks are published and their admission is a prefix hit
// (the last, partial block and at least the prompt's last token are computed again per choice).
class ChoiceSet {
 public:
  // Sums of generated tokens over the choices past this answer 400.
  static constexpr int64_t kMaxTokens = int64_t(1) << 18;

  ChoiceSet(Engine& engine, const ServedModel& model, ApiKind kind, const ApiRequest& r, PreparedRequest p,
            const ResponseContext& ctx)
      : engine_(engine), base_(std::move(p.generation)), n_out_(r.n), rank_(r.best_of > r.n) {
    const int32_t n_gen = std::max(r.n, r.best_of);
    // Ranking needs each candidate's chosen-token logprobs; the answer shows them only if asked.
    if (rank_) base_.logprobs = std::max(base_.logprobs, 0);
    // Unseeded choices get a drawn base seed: identical requests with seeds the engine draws
    // would share one checkpoint key, and a choice could resume from another's checkpoint.
    if (!base_.sampling.has_seed) {
      std::random_device rd;
      base_.sampling.seed = (uint64_t(rd()) << 32) ^ uint64_t(rd());
      base_.sampling.has_seed = true;
    }
    for (int32_t i = 0; i < n_gen; ++i) {
      auto g = std::make_shared<Generation>();
      ResponseContext c = ctx;
      c.choice_index = i;
      c.shared_stream = true;
      g->assembler = std::make_unique<OutputAssembler>(model.tokenizer, p.output);
      g->builder = make_response_builder(kind, std::move(c), model.tokenizer);
      gens_.push_back(std::move(g));
    }
    fins_.resize(gens_.size());
    ended_.assign(gens_.size(), false);
    chosen_lp_.resize(gens_.size());
  }

  Generation& first() { return *gens_[0]; }

  // Choice i as the engine runs it: its own id, and with a seed, seed + i (reproducible per
  // choice, different between choices).
  GenerationRequest request(size_t i) const {
    GenerationRequest g = base_;
    if (i > 0) g.id = base_.id + "-" + std::to_string(i);
    if (g.sampling.has_seed) g.sampling.seed = base_.sampling.seed + uint64_t(i);
    return g;
  }

  Status submit(size_t i) {
    auto s = engine_.submit(request(i));
    if (!s.ok()) return s.error();
    gens_[i]->stream = std::move(s).value();
    return Status{};
  }

  // Every builder's opening text (chat: one role chunk per choice).
  std::string start() {
    std::string out;
    for (auto& g : gens_) out += g->builder->start();
    return out;
  }

  // Feeds what the streams have (waiting up to `wait` when none has anything); returns the SSE
  // text. done() once every choice ended; failed() holds the first error.
  std::string poll(std::chrono::milliseconds wait) {
    std::string out;
    bool any = false;
    for (size_t i = 0; i < gens_.size(); ++i) {
      if (ended_[i] || !gens_[i]->stream) continue;
      while (auto ev = gens_[i]->stream->next(std::chrono::milliseconds(0))) {
        any = true;
        out += on_event(i, *ev);
        if (ended_[i]) break;
      }
    }
    if (!any && !done()) {
      // One wait serves one stream: with several live, it is kept short so that the others'
      // tokens are not held back behind it.
      size_t live = 0;
      for (size_t i = 0; i < gens_.size(); ++i) live += !ended_[i] && gens_[i]->stream;
      if (live > 1) wait = std::min(wait, std::chrono::milliseconds(2));
      for (size_t i = 0; i < gens_.size(); ++i) {
        if (ended_[i] || !gens_[i]->stream) continue;
        if (auto ev = gens_[i]->stream->next(wait)) out += on_event(i, *ev);
        break;
      }
    }
    return out;
  }

  bool done() const { return std::all_of(ended_.begin(), ended_.end(), [](bool e) { return e; }); }
  const std::optional<ApiError>& failed() const { return error_; }
  bool engine_lost() const { return engine_lost_; }

  void cancel_all() {
    cancelled_ = true;
    for (size_t i = 0; i < gens_.size(); ++i) {
      if (gens_[i]->stream && !ended_[i] && !gens_[i]->cancel_sent) {
        gens_[i]->cancel_sent = true;
        gens_[i]->stream->cancel();
      }
    }
  }

  void count_usage(ServerMetrics& metrics) const {
    // Each choice is one engine request: the metrics count its prompt, cached tokens and all.
    for (size_t i = 0; i < gens_.size(); ++i) {
      if (gens_[i]->stream) metrics.count_usage(fins_[i].usage);
    }
  }

  Usage usage() const {
    std::vector<Usage> us;
    for (const auto& f : fins_) us.push_back(f.usage);
    return sum_choice_usage(us);
  }

  std::string stream_end() const { return gens_[0]->builder->stream_end(usage()); }

  // The non-streaming answer: every choice, or the n best of the best_of candidates.
  json body() const {
    std::vector<size_t> order;
    if (rank_) {
      std::vector<double> cum(gens_.size(), 0.0);
      for (size_t i = 0; i < gens_.size(); ++i) {
        const size_t n = std::min(chosen_lp_[i].size(), size_t(std::max(gens_[i]->assembler->n_tokens(), 0)));
        for (size_t k = 0; k < n; ++k) cum[i] += chosen_lp_[i][k];
      }
      order = best_candidates(cum, size_t(n_out_));
    } else {
      for (size_t i = 0; i < gens_.size(); ++i) order.push_back(i);
    }
    std::vector<json> bodies;
    for (size_t i : order) bodies.push_back(gens_[i]->builder->body());
    json out = merge_choice_bodies(bodies, usage());
    const json first = gens_[0]->builder->body();
    if (first.contains("usage") && first["usage"].contains("strata")) out["usage"]["strata"] = first["usage"]["strata"];
    return out;
  }

 private:
  std::string on_event(size_t i, const StreamEvent& ev) {
    Generation& g = *gens_[i];
    for (const auto& lp : ev.logprobs) chosen_lp_[i].push_back(std::isfinite(lp.chosen.logprob) ? lp.chosen.logprob : -9999.0);
    bool final = false;
    std::string out = g.feed(ev, &final, &fins_[i]);
    if (i == 0 && !rest_submitted_ && (!ev.tokens.empty() || final)) submit_rest();
    if (!final) return out;
    ended_[i] = true;
    const FinishState& fin = fins_[i];
    if (fin.reason == FinishReason::kError && !fin.stop_string) {
      if (!error_) {
        ApiError e;
        e.status = 500;
        e.message = "generation failed: " + fin.error;
        error_ = e;
        engine_lost_ = !engine_.alive();
      }
      cancel_all();
      return out;
    }
    return out + g.complete(fin);
  }

  void submit_rest() {
    rest_submitted_ = true;
    for (size_t i = 1; i < gens_.size(); ++i) {
      if (error_ || cancelled_) {
        ended_[i] = true;  // never submitted
        continue;
      }
      Status s = submit(i);
      if (s.ok()) continue;
      ApiError e = api_error_from(s.error());
      if (e.status == 429) e.message = s.error().message + "; retry later";
      error_ = e;
      ended_[i] = true;
      cancel_all();
    }
  }

  Engine& engine_;
  GenerationRequest base_;
  int32_t n_out_;
  bool rank_;
  std::vector<std::shared_ptr<Generation>> gens_;
  std::vector<FinishState> fins_;
  std::vector<bool> ended_;
  std::vector<std::vector<double>> chosen_lp_;  // per choice, per generated token
  bool rest_submitted_ = false;
  bool cancelled_ = false;  // the client left or a choice failed: nothing more is submitted
  std::optional<ApiError> error_;
  bool engine_lost_ = false;
};

// The checks of an answer of several choices that need the prepared request.
std::optional<ApiError> check_choices(const ApiRequest& r, const PreparedRequest& p, bool stream_parts) {
  const int32_t n_gen = std::max(r.n, r.best_of);
  const char* field = r.best_of > r.n ? "best_of" : "n";
  const int64_t total = int64_t(n_gen) * p.generation.max_tokens;
  if (total > ChoiceSet::kMaxTokens) {
    return bad_field(field, std::string(field) + " (" + std::to_string(n_gen) + ") x max_tokens (" +
                                std::to_string(p.generation.max_tokens) + ") = " + std::to_string(total) +
                                " tokens, more than this server generates for one request (" +
                                std::to_string(ChoiceSet::kMaxTokens) + ")");
  }
  if (stream_parts && r.stream) {
    return bad_field("n", "n " + std::to_string(r.n) + " with stream is not supported under --supervise");
  }
  return std::nullopt;
}

// Answers a request of several choices (ChoiceSet) with one body or one shared stream.
void serve_choices(Engine& engine, const ServedModel& model, ServerMetrics& metrics, bool supervised,
                   const httplib::Request& req, httplib::Response& res, ApiKind kind, const ApiRequest& r,
                   PreparedRequest p, const ResponseContext& ctx, RequestTrace::Clock::time_point arrived,
                   bool trace_in_usage) {
  auto set = std::make_shared<ChoiceSet>(engine, model, kind, r, std::move(p), ctx);
  if (Status s = set->submit(0); !s.ok()) {
    ApiError e = api_error_from(s.error());
    if (s.error().code == ErrorCode::kUnsupported) e.status = 503;
    if (e.status == 429) e.message = s.error().message + "; retry later";
    write_error(req, res, e);
    metrics.count_request(req.path, e.status);
    return;
  }
  Generation& first = set->first();
  first.trace.emplace(res.get_header_value(kRequestIdHeader), arrived);
  first.trace->submitted();
  first.trace_in_usage = trace_in_usage;
  first.method = req.method;
  first.path = req.path;
  const int fd = find_connection_fd(req.local_port, req.remote_addr, req.remote_port);
  metrics.count_request(req.path, 200);

  if (!r.stream) {
    set->start();
    auto checked = std::chrono::steady_clock::now();
    bool cancelled = false;
    while (!set->done()) {
      set->poll(kPoll);
      if (!cancelled && std::chrono::steady_clock::now() - checked >= kPoll) {
        checked = std::chrono::steady_clock::now();
        if (peer_closed(fd)) {
          cancelled = true;
          set->cancel_all();
          metrics.count_disconnect();
        }
      }
    }
    set->count_usage(metrics);
    if (const auto& e = set->failed()) {
      if (supervised && set->engine_lost()) res.set_header(kEngineDownHeader, "1");
      write_error(req, res, *e);
      return;
    }
    write_json(res, set->body());
    return;
  }

  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  res.set_chunked_content_provider(
      "text/event-stream",
      [set, fd, &metrics](size_t, httplib::DataSink& sink) {
        auto write = [&](const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); };
        auto vanish = [&] {
          set->cancel_all();
          metrics.count_disconnect();
          return false;
        };
        if (!write(set->start())) return vanish();
        while (!set->done()) {
          const std::string text = set->poll(kPoll);
          if (text.empty() && peer_closed(fd)) return vanish();
          if (!write(text)) return vanish();
        }
        set->count_usage(metrics);
        if (const auto& e = set->failed()) {
          write(set->first().builder->stream_error(*e));
        } else {
          write(set->stream_end());
        }
        sink.done();
        return true;
      },
      [set](bool) { set->cancel_all(); });
}

}  // namespace

HttpServer::HttpServer(Engine& engine, const ServedModel& model, HttpOptions options)
    : engine_(engine),
      model_(model),
      options_(std::move(options)),
      responses_(options_.responses_store_ttl_s, options_.responses_store_bytes),
      http_(std::make_unique<httplib::Server>()) {
  if (const char* marker = std::getenv(kCrashMarkerEnv); marker && *marker) crash_marker_ = marker;
  install_routes();
  ListenerLimits limits = options_.listener;
  limits.workers = std::max(options_.http_threads, 4);
  limits.max_body_bytes = options_.max_body_bytes;
  listener_ = std::make_unique<HttpListener>(*http_, limits);
}

HttpServer::~HttpServer() {
  stop();
  listener_.reset();
}

Result<int> HttpServer::bind() { return listener_->bind(options_.host, options_.port); }

bool HttpServer::run() { return listener_->run(); }

void HttpServer::stop() {
  if (listener_) listener_->stop();
}

void HttpServer::install_routes() {
  httplib::Server& s = *http_;
  s.set_payload_max_length(options_.max_body_bytes);
  s.set_read_timeout(30, 0);
  s.set_write_timeout(30, 0);

  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    res.set_header(kRequestIdHeader, accept_request_id(req.get_header_value(kRequestIdHeader)));
    // The page holds no data; its own calls send the key typed into it.
    if (req.path == "/health" || req.path == "/") return httplib::Server::HandlerResponse::Unhandled;
    const auto e = check_api_key(options_.api_key, req.get_header_value("Authorization"), req.get_header_value("x-api-key"));
    if (!e) return httplib::Server::HandlerResponse::Unhandled;
    write_error(req, res, *e);
    metrics_.count_request(req.path, 401);
    return httplib::Server::HandlerResponse::Handled;
  });

  s.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    ApiError e;
    e.status = res.status;
    if (res.status == 413) {
      e.message = "request body is larger than --max-body-bytes (" + std::to_string(options_.max_body_bytes) + " bytes)";
      e.param = "body";
    } else if (res.status == 404) {
      e.message = "no route for " + req.method + " " + req.path;
    } else {
      e.message = "HTTP error " + std::to_string(res.status);
    }
    write_error(req, res, e);
    metrics_.count_request(res.status == 404 ? "other" : req.path, res.status);
  });

  // One line per request; a generation that was submitted logs its own, with its trace.
  s.set_logger([](const httplib::Request& req, const httplib::Response& res) {
    const bool generation = req.path == "/v1/chat/completions" || req.path == "/v1/completions" ||
                            req.path == "/v1/messages" || req.path == "/v1/responses";
    if (generation && res.status == 200) return;
    const std::string line = "request id=" + res.get_header_value(kRequestIdHeader) + " method=" + req.method +
                             " path=" + req.path + " status=" + std::to_string(res.status);
    if (req.path == "/health" || req.path == "/metrics") log::debug("{}", line);
    else log::info("{}", line);
  });

  s.set_exception_handler([this](const httplib::Request& req, httplib::Response& res, std::exception_ptr ep) {
    write_internal_error(req, res, ep);
    metrics_.count_request(req.path, 500);
  });

  s.Get("/health", [this](const httplib::Request& req, httplib::Response& res) {
    if (engine_.alive()) {
      write_json(res, {{"status", "ok"}});
    } else {
      res.status = 503;
      res.set_content(json{{"status", "error"}, {"message", "the engine loop is not running"}}.dump(), "application/json");
    }
  });

  s.Get("/", [this](const httplib::Request& req, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_header("Content-Security-Policy", "default-src 'self'; style-src 'unsafe-inline'; script-src 'unsafe-inline'");
    res.set_content(status_page_html(), "text/html; charset=utf-8");
    metrics_.count_request(req.path, 200);
  });

  s.Get("/status", [this](const httplib::Request& req, httplib::Response& res) {
    const StatusInfo info{model_.name, options_.device, model_.max_model_len, engine_.block_size(), engine_.kv_bytes_per_token()};
    write_json(res, status_json(info, engine_.stats()));
    metrics_.count_request(req.path, 200);
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    ServerMetrics::Snapshot snap = metrics_.snapshot();
    snap.rejected_connections = listener_->rejected();
    res.set_content(render_metrics(snap, engine_.stats(), model_.name), "text/plain; version=0.0.4");
  });

  // Writes what the KV disk tier's queue holds before returning (at most ?timeout_s seconds, default 30).
  s.Post("/admin/cache/flush", [this](const httplib::Request& req, httplib::Response& res) {
    double timeout = 30.0;
    if (req.has_param("timeout_s")) {
      try {
        timeout = std::stod(req.get_param_value("timeout_s"));
      } catch (const std::exception&) {
        timeout = -1.0;
      }
      if (!(timeout >= 0.0 && timeout <= 3600.0)) {
        res.status = 400;
        res.set_content(json{{"error", {{"message", "timeout_s must be in [0, 3600], got '" +
                                                        req.get_param_value("timeout_s") + "'"}}}}.dump(),
                        "application/json");
        metrics_.count_request(req.path, 400);
        return;
      }
    }
    const bool flushed = engine_.flush_kv_tiers(timeout);
    const KvTierStats t = engine_.stats().kv_tiers;
    write_json(res, {{"flushed", flushed}, {"queued_bytes", t.disk.queued_bytes}, {"written_blocks", t.disk.written_blocks},
                     {"dropped_blocks", t.disk.dropped_blocks}});
    if (!flushed) res.status = 504;  // the deadline passed with blocks still queued
    metrics_.count_request(req.path, res.status);
  });

  auto model_card = [this] {
    json card = {{"id", model_.name}, {"object", "model"}, {"created", int64_t(0)}, {"owned_by", "strata"},
                 {"max_model_len", model_.max_model_len}, {"vocab_size", model_.tokenizer.vocab_size()}};
    // The shape clients such as `strata bench serve` compute rooflines from.
    const ModelConfig& mc = engine_.model_config();
    card["strata"] = {{"model_type", mc.model_type}, {"n_layers", mc.n_layers}, {"hidden", mc.hidden},
                      {"intermediate", mc.intermediate}, {"n_heads", mc.n_heads}, {"n_kv_heads", mc.n_kv_heads},
                      {"head_dim", mc.head_dim}, {"vocab", mc.vocab_size}, {"tied", mc.tie_embeddings},
                      {"kv_bytes_per_token", engine_.kv_bytes_per_token()}, {"kv_blocks", engine_.n_kv_blocks()},
                      {"block_size", engine_.block_size()}};
    return card;
  };
  // A LoRA adapter is listed as a model of its own whose parent is the served model (vLLM's shape).
  auto adapter_card = [this](const std::string& name) {
    return json{{"id", name}, {"object", "model"}, {"created", int64_t(0)}, {"owned_by", "strata"},
                {"max_model_len", model_.max_model_len}, {"parent", model_.name}, {"root", model_.name}};
  };
  s.Get("/v1/models", [this, model_card, adapter_card](const httplib::Request& req, httplib::Response& res) {
    json data = json::array({model_card()});
    for (const std::string& a : engine_.lora_names()) data.push_back(adapter_card(a));
    write_json(res, {{"object", "list"}, {"data", std::move(data)}});
    metrics_.count_request(req.path, 200);
  });
  // The openai client's models.retrieve(id); ids may hold slashes (org/name).
  s.Get(R"(/v1/models/(.+))", [this, model_card, adapter_card](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (const auto names = engine_.lora_names(); std::find(names.begin(), names.end(), id) != names.end()) {
      write_json(res, adapter_card(id));
      metrics_.count_request("/v1/models/{id}", 200);
      return;
    }
    if (id != model_.name) {
      ApiError e;
      e.status = 404;
      e.param = "model";
      e.code = "model_not_found";
      e.message = "model '" + id + "' does not exist; this server serves '" + model_.name + "'";
      write_error(req, res, e);
      metrics_.count_request("/v1/models/{id}", 404);
      return;
    }
    write_json(res, model_card());
    metrics_.count_request("/v1/models/{id}", 200);
  });

  // Anthropic's token counting: the Messages request's prompt as the chat template renders it.
  s.Post("/v1/messages/count_tokens", [this](const httplib::Request& req, httplib::Response& res) {
    auto fail = [&](const ApiError& e) {
      write_error(req, res, e);
      metrics_.count_request(req.path, e.status);
    };
    json body;
    if (auto e = parse_body(req.body, options_.max_json_depth, &body)) return fail(*e);
    if (!body.is_object()) return fail(bad_field("body", "request body must be a JSON object"));
    if (!body.contains("max_tokens")) body["max_tokens"] = 1;  // not part of a count request
    ApiRequest r;
    const ParseLimits limits{model_names(), options_.max_json_depth};
    if (auto e = parse_messages_request(body, limits, &r)) return fail(*e);
    std::string text;
    if (auto e = render_chat_prompt(r, model_, &text)) return fail(*e);
    auto enc = model_.tokenizer.encode(text, false);
    if (!enc.ok()) return fail(bad_field("messages", enc.error().message));
    write_json(res, {{"input_tokens", enc->size()}});
    metrics_.count_request(req.path, 200);
  });

  s.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    json body;
    ParseLimits limits{model_names(), options_.max_json_depth};
    auto fail = [&](const ApiError& e) {
      write_error(req, res, e);
      metrics_.count_request(req.path, e.status);
    };
    if (auto e = parse_body(req.body, options_.max_json_depth, &body)) return fail(*e);
    if (!body.is_object()) return fail(bad_field("body", "request body must be a JSON object"));
    std::vector<int32_t> ids;
    if (body.contains("messages")) {
      ApiRequest r;
      if (auto e = parse_chat_request(body, limits, &r)) return fail(*e);
      std::string text;
      if (auto e = render_chat_prompt(r, model_, &text)) return fail(*e);
      auto enc = model_.tokenizer.encode(text, false);
      if (!enc.ok()) return fail(bad_field("messages", enc.error().message));
      ids = std::move(enc).value();
    } else {
      auto p = body.find("prompt");
      if (p == body.end() || !p->is_string()) return fail(bad_field("prompt", "prompt must be a string (or send messages)"));
      bool add_special = true;
      if (auto a = body.find("add_special_tokens"); a != body.end()) {
        if (!a->is_boolean()) return fail(bad_field("add_special_tokens", "add_special_tokens must be a boolean"));
        add_special = a->get<bool>();
      }
      auto enc = model_.tokenizer.encode(p->get<std::string>(), add_special);
      if (!enc.ok()) return fail(bad_field("prompt", enc.error().message));
      ids = std::move(enc).value();
    }
    write_json(res, {{"count", ids.size()}, {"max_model_len", model_.max_model_len}, {"tokens", ids}});
    metrics_.count_request(req.path, 200);
  });

  s.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
    json body;
    auto fail = [&](const ApiError& e) {
      write_error(req, res, e);
      metrics_.count_request(req.path, e.status);
    };
    if (auto e = parse_body(req.body, options_.max_json_depth, &body)) return fail(*e);
    if (!body.is_object()) return fail(bad_field("body", "request body must be a JSON object"));
    auto t = body.find("tokens");
    if (t == body.end() || !t->is_array()) return fail(bad_field("tokens", "tokens must be an array of token ids"));
    std::vector<int32_t> ids;
    const int32_t vocab = model_.tokenizer.vocab_size();
    for (size_t i = 0; i < t->size(); ++i) {
      const json& v = (*t)[i];
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab) {
        return fail(bad_field("tokens", "tokens[" + std::to_string(i) + "] must be a token id in [0, " + std::to_string(vocab) +
                                            "), got " + json_excerpt(v)));
      }
      ids.push_back(v.get<int32_t>());
    }
    write_json(res, {{"prompt", model_.tokenizer.decode(ids, false)}});
    metrics_.count_request(req.path, 200);
  });

  auto generate = [this](ApiKind kind) {
    return [this, kind](const httplib::Request& req, httplib::Response& res) {
      const auto arrived = RequestTrace::Clock::now();
      auto fail = [&](const ApiError& e) {
        write_error(req, res, e);
        metrics_.count_request(req.path, e.status);
      };
      json body;
      if (auto e = parse_body(req.body, options_.max_json_depth, &body)) return fail(*e);
      bool trace_in_usage = false;
      if (auto e = parse_trace_option(body, &trace_in_usage)) return fail(*e);
      ApiRequest r;
      ResponsesRequest rr;  // kResponses: r is its chat form
      const ParseLimits limits{model_names(), options_.max_json_depth};
      std::optional<ApiError> perr;
      if (kind == ApiKind::kResponses) {
        perr = parse_responses_request(body, limits, &rr);
        if (!perr) perr = resolve_previous_response(responses_, &rr);
        if (!perr) r = rr.api;
      } else {
        perr = kind == ApiKind::kChat         ? parse_chat_request(body, limits, &r)
               : kind == ApiKind::kCompletion ? parse_completion_request(body, limits, &r)
                                              : parse_messages_request(body, limits, &r);
      }
      if (perr) return fail(*perr);
      if (r.session_id.empty()) r.session_id = req.get_header_value("X-Session-Id");
      const bool from_supervisor = options_.supervised && !options_.supervisor_secret.empty() &&
                                   secrets_equal(req.get_header_value(kSupervisorSecretHeader), options_.supervisor_secret);
      const SupervisedHeaders sup = from_supervisor ? read_supervised_headers(req) : SupervisedHeaders{};
      if (!crash_marker_.empty() && req.body.find(crash_marker_) != std::string::npos) {
        log::error("{}: the request holds {}: crashing as asked", req.path, kCrashMarkerEnv);
        std::abort();
      }
      if (!r.seed && sup.seed) r.seed = sup.seed;
      PreparedRequest p;
      if (auto e = prepare_request(r, model_, &p)) return fail(*e);
      // A model name other than the served model's is one of its LoRA adapters (checked above).
      if (!r.model.empty() && r.model != model_.name) p.generation.adapter = r.model;
      const bool choices = r.n > 1 || r.best_of > 1;
      if (choices) {
        if (auto e = check_choices(r, p, sup.stream_parts)) return fail(*e);
      }
      if (!engine_.alive()) {
        ApiError e;
        e.status = 503;
        e.message = "the engine loop is not running";
        if (options_.supervised) res.set_header(kEngineDownHeader, "1");
        return fail(e);
      }
      ResponseContext ctx;
      ctx.id = sup.response_id.empty() ? random_id(id_prefix(kind)) : sup.response_id;
      // An adapter's answer names the adapter, as the client asked for it.
      ctx.model = p.generation.adapter.empty() ? model_.name : p.generation.adapter;
      ctx.created = sup.created ? *sup.created
                                : std::chrono::duration_cast<std::chrono::seconds>(Clock::now().time_since_epoch()).count();
      ctx.include_usage = r.include_usage;
      ctx.logprobs = r.logprobs;
      ctx.tokens_as_ids = r.tokens_as_ids;
      ctx.echo = r.echo;
      ctx.prompt_text = p.prompt_text;
      ctx.prompt_ids = p.generation.prompt;
      p.generation.id = ctx.id;
      if (choices) {
        serve_choices(engine_, model_, metrics_, options_.supervised, req, res, kind, r, std::move(p), ctx, arrived,
                      trace_in_usage);
        return;
      }
      auto submitted = engine_.submit(std::move(p.generation));
      if (!submitted.ok()) {
        ApiError e = api_error_from(submitted.error());
        if (submitted.error().code == ErrorCode::kUnsupported) e.status = 503;
        if (e.status == 429) e.message = submitted.error().message + "; retry later";
        return fail(e);
      }
      auto gen = std::make_shared<Generation>();
      gen->stream = std::move(submitted).value();
      gen->trace.emplace(res.get_header_value(kRequestIdHeader), arrived);
      gen->trace->submitted();
      gen->trace_in_usage = trace_in_usage;
      gen->method = req.method;
      gen->path = req.path;
      gen->assembler = std::make_unique<OutputAssembler>(model_.tokenizer, p.output);
      if (kind == ApiKind::kResponses) {
        const std::string id = ctx.id;
        auto rb = std::make_unique<ResponsesBuilder>(std::move(ctx), rr.echo);
        if (rr.store) {
          // Stored before the last event is sent, so a client that continues at once finds it.
          gen->on_complete = [this, b = rb.get(), id, conv = std::move(rr.conversation)]() mutable {
            conv.push_back(b->assistant_message());
            responses_.put(id, StoredResponse{std::move(conv), b->body()});
          };
        }
        gen->builder = std::move(rb);
      } else {
        gen->builder = make_response_builder(kind, std::move(ctx), model_.tokenizer);
      }
      gen->fd = find_connection_fd(req.local_port, req.remote_addr, req.remote_port);
      metrics_.count_request(req.path, 200);

      if (!r.stream) {
        gen->builder->start();  // its SSE text is not needed, its state (echo) is
        FinishState fin;
        bool final = false;
        // Tokens may arrive faster than the poll interval: the client is checked by the clock.
        auto checked = std::chrono::steady_clock::now();
        while (!final) {
          auto ev = gen->stream->next(kPoll);
          if (!gen->cancel_sent && std::chrono::steady_clock::now() - checked >= kPoll) {
            checked = std::chrono::steady_clock::now();
            if (peer_closed(gen->fd)) {
              gen->cancel_sent = true;
              gen->stream->cancel();
              metrics_.count_disconnect();
            }
          }
          if (ev) gen->feed(*ev, &final, &fin);
        }
        metrics_.count_usage(fin.usage);
        if (fin.reason == FinishReason::kError && !fin.stop_string) {
          // The 500 is logged as every answer but a submitted generation's 200 is.
          // The supervising process re-sends a request its dead engine failed.
          if (options_.supervised && !engine_.alive()) res.set_header(kEngineDownHeader, "1");
          ApiError e;
          e.status = 500;
          e.message = "generation failed: " + fin.error;
          write_error(req, res, e);
          return;
        }
        gen->complete(fin);
        write_json(res, gen->builder->body());
        return;
      }

      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      if (sup.stream_parts) {
        res.set_chunked_content_provider(
            "text/event-stream",
            [this, gen](size_t, httplib::DataSink& sink) { return stream_parts(*gen, sink, engine_, metrics_); },
            [gen](bool) {
              if (!gen->stream->done() && !gen->cancel_sent) gen->stream->cancel();
            });
        return;
      }
      res.set_chunked_content_provider(
          "text/event-stream",
          [this, gen](size_t, httplib::DataSink& sink) {
            auto write = [&](const std::string& s) { return s.empty() || sink.write(s.data(), s.size()); };
            auto vanish = [&] {
              if (!gen->cancel_sent) {
                gen->cancel_sent = true;
                gen->stream->cancel();
                metrics_.count_disconnect();
              }
              return false;
            };
            if (!write(gen->builder->start())) return vanish();
            FinishState fin;
            bool final = false;
            while (!final) {
              auto ev = gen->stream->next(kPoll);
              if (!ev) {
                if (peer_closed(gen->fd)) return vanish();
                continue;
              }
              const std::string text = gen->feed(*ev, &final, &fin);
              if (!write(text)) return vanish();
            }
            metrics_.count_usage(fin.usage);
            std::string tail;
            if (fin.reason == FinishReason::kError && !fin.stop_string) {
              ApiError e;
              e.status = 500;
              e.message = "generation failed: " + fin.error;
              tail = gen->builder->stream_error(e);
              gen->log_end(500, fin);
            } else {
              tail = gen->complete(fin);
            }
            write(tail);
            sink.done();
            return true;
          },
          [gen](bool) {
            // The response ended (or the connection broke): dropping the stream cancels a
            // generation still running.
            if (!gen->stream->done() && !gen->cancel_sent) gen->stream->cancel();
          });
    };
  };
  // LoRA adapters at run time (vLLM's endpoints), behind --allow-runtime-lora and the API key;
  // paths must lie inside --lora-dir.
  auto lora_admin = [this](bool load) {
    return [this, load](const httplib::Request& req, httplib::Response& res) {
      auto fail = [&](const ApiError& e) {
        write_error(req, res, e);
        metrics_.count_request(req.path, e.status);
      };
      if (!options_.allow_runtime_lora) {
        ApiError e;
        e.status = 403;
        e.message = "loading and unloading adapters at run time is off (start the server with --allow-runtime-lora)";
        return fail(e);
      }
      json body;
      if (auto e = parse_body(req.body, options_.max_json_depth, &body)) return fail(*e);
      if (!body.is_object()) return fail(bad_field("body", "request body must be a JSON object"));
      const json* name = find_field(body, "lora_name");
      if (!name || !name->is_string() || name->get<std::string>().empty()) {
        return fail(name ? wrong_type("lora_name", *name, "a non-empty string") : bad_field("lora_name", "lora_name is required"));
      }
      const std::string n = name->get<std::string>();
      if (n == model_.name) return fail(bad_field("lora_name", "lora_name '" + n + "' is the served model's name"));
      Status st;
      if (load) {
        const json* path = find_field(body, "lora_path");
        if (!path || !path->is_string()) {
          return fail(path ? wrong_type("lora_path", *path, "a string") : bad_field("lora_path", "lora_path is required"));
        }
        std::error_code ec;
        const auto root = std::filesystem::weakly_canonical(options_.lora_dir, ec);
        const auto target = std::filesystem::weakly_canonical(std::filesystem::path(options_.lora_dir) / path->get<std::string>(), ec);
        const std::string r = root.string(), t = target.string();
        if (ec || t.size() <= r.size() || t.compare(0, r.size(), r) != 0 || t[r.size()] != '/') {
          return fail(bad_field("lora_path", "lora_path '" + path->get<std::string>() + "' is not inside --lora-dir " + r));
        }
        st = engine_.load_lora(n, t, options_.max_lora_rank);
      } else {
        st = engine_.unload_lora(n);
      }
      if (!st.ok()) {
        ApiError e = api_error_from(st.error(), load ? "lora_path" : "lora_name");
        if (!load && st.error().code == ErrorCode::kNotFound) e.status = 404;
        if (load && st.error().message.find("already loaded") != std::string::npos) e.param = "lora_name";
        return fail(e);
      }
      log::info("LoRA adapter {} {}", n, load ? "loaded" : "unloaded");
      write_json(res, {{"object", "lora_adapter"}, {"id", n}, {"loaded", load}});
      metrics_.count_request(req.path, 200);
    };
  };
  s.Post("/v1/load_lora_adapter", lora_admin(true));
  s.Post("/v1/unload_lora_adapter", lora_admin(false));

  s.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) {
    auto fail = [&](const ApiError& e) {
      write_error(req, res, e);
      metrics_.count_request(req.path, e.status);
    };
    json body;
    if (auto e = parse_body(req.body, options_.max_json_depth, &body)) return fail(*e);
    if (!body.is_object()) return fail(bad_field("body", "request body must be a JSON object"));
    EmbeddingsRequest r;
    if (auto e = parse_embeddings_request(body, model_, ParseLimits{{model_.name}, options_.max_json_depth}, &r)) return fail(*e);
    static std::atomic<uint64_t> counter{0};
    const int fd = find_connection_fd(req.local_port, req.remote_addr, req.remote_port);
    std::vector<std::vector<float>> vectors;
    Usage usage;
    if (auto e = run_embeddings(engine_, model_, r, "embd-" + std::to_string(counter.fetch_add(1)),
                                [fd] { return peer_closed(fd); }, &vectors, &usage)) {
      if (e->status == 499) metrics_.count_disconnect();
      return fail(*e);
    }
    metrics_.count_usage(usage);
    write_json(res, embeddings_response(r, vectors, model_.name));
    metrics_.count_request(req.path, 200);
  });
  s.Post("/v1/chat/completions", generate(ApiKind::kChat));
  s.Post("/v1/completions", generate(ApiKind::kCompletion));
  s.Post("/v1/messages", generate(ApiKind::kMessages));
  s.Post("/v1/responses", generate(ApiKind::kResponses));
  // A stored response (store: true, within --responses-store-ttl): retrieve or delete it.
  auto stored_response = [this](bool erase) {
    return [this, erase](const httplib::Request& req, httplib::Response& res) {
      const std::string id = req.matches[1];
      auto found = responses_.get(id);
      if (!found) {
        ApiError e;
        e.status = 404;
        e.param = "response_id";
        e.message = "response '" + id + "' is not stored here (unknown, expired or stored with store: false)";
        write_error(req, res, e);
        metrics_.count_request("/v1/responses/{id}", 404);
        return;
      }
      if (erase) {
        responses_.erase(id);
        write_json(res, {{"id", id}, {"object", "response"}, {"deleted", true}});
      } else {
        write_json(res, found->response);
      }
      metrics_.count_request("/v1/responses/{id}", 200);
    };
  };
  s.Get(R"(/v1/responses/([^/]+))", stored_response(false));
  s.Delete(R"(/v1/responses/([^/]+))", stored_response(true));
}

}  // namespace strata::server
