// HttpServer: the OpenAI- and Anthropic-compatible HTTP front of an Engine (cpp-httplib).
// Routes: POST /v1/chat/completions, /v1/completions, /v1/messages, /v1/responses, /v1/embeddings,
// /v1/load_lora_adapter, /v1/unload_lora_adapter, /tokenize,
// /detokenize; GET /v1/models, /v1/responses/{id}, /health, /metrics, /status and the page at /. HTTP threads only parse, tokenize, submit and stream;
// the engine thread does the rest (engine.h). The thread pool is sized (http_threads) so that
// max_num_seqs streams run at once with room for short requests beside them.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "engine/engine.h"
#include "server/http_listener.h"
#include "server/metrics.h"
#include "server/request_mapping.h"
#include "server/response_store.h"

namespace httplib {
class Server;
}

namespace strata::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8080;                      // 0: any free port
  std::string api_key;                  // "": no authentication
  std::string device;                   // where the engine runs, for the status page ("cpu", "cuda")
  size_t max_body_bytes = size_t(32) << 20;  // bytes
  int http_threads = 72;                // workers (strata serve: --max-num-seqs + 8 unless --http-threads)
  // Run as the engine process of `strata serve --supervise` (supervisor.h): the X-Strata-*
  // headers of the supervising process are honored (pinned seed, response id and created,
  // stream parts) and a stream cut by a dead engine ends without its closing events.
  bool supervised = false;
  // The secret a supervising process sends in kSupervisorSecretHeader: X-Strata-* headers are
  // honored only with it (a client that reaches the child's port directly cannot forge them).
  std::string supervisor_secret;
  int max_json_depth = 256;  // JSON nested deeper answers 400 (json_guard.h)
  // The Responses API's stored responses (previous_response_id): seconds each lives, and the
  // bytes all of them may hold.
  double responses_store_ttl_s = 3600.0;
  size_t responses_store_bytes = size_t(64) << 20;
  // Connection screening (http_listener.h); its workers and body limit come from http_threads
  // and max_body_bytes above.
  ListenerLimits listener;
  // LoRA adapters at run time: POST /v1/load_lora_adapter and /v1/unload_lora_adapter answer
  // only when allowed, reading adapters from inside lora_dir, of rank <= max_lora_rank (0: any).
  bool allow_runtime_lora = false;
  std::string lora_dir;
  int32_t max_lora_rank = 0;
};

// Fault injection for the supervisor's tests: when this variable is set, a generation request
// whose body contains its value aborts the engine process (a request that crashes the engine).
inline constexpr const char* kCrashMarkerEnv = "STRATA_TEST_CRASH_MARKER";

class HttpServer {
 public:
  HttpServer(Engine& engine, const ServedModel& model, HttpOptions options);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the listening socket; returns the port (the chosen one when options.port is 0).
  Result<int> bind();
  // Serves until stop(); returns false if the listener failed.
  bool run();
  void stop();

 private:
  void install_routes();
  // What a request's "model" may name: the served model, then its LoRA adapters.
  std::vector<std::string> model_names() const {
    std::vector<std::string> v{model_.name};
    for (std::string& a : engine_.lora_names()) v.push_back(std::move(a));
    return v;
  }

  Engine& engine_;
  const ServedModel& model_;
  HttpOptions options_;
  ServerMetrics metrics_;
  ResponseStore responses_;
  std::unique_ptr<httplib::Server> http_;
  std::unique_ptr<HttpListener> listener_;
  std::string crash_marker_;  // kCrashMarkerEnv's value: a generation request holding it aborts the process
};

}  // namespace strata::server
