// strata serve: loads a model, starts the batched engine and serves the OpenAI- and
// Anthropic-compatible HTTP API until SIGINT/SIGTERM. With no --model it serves the
// repository's models/strata-demo (found from $STRATA_MODEL, else relative to the binary).
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cli/commands.h"
#include "cli/device.h"
#include "cli/speculative_args.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/registry.h"
#include "server/http_server.h"
#include "server/request_mapping.h"
#include "server/supervisor.h"

namespace strata::cli {

namespace {

namespace fs = std::filesystem;

struct ServeArgs {
  std::string model_dir;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string served_model_name;
  KvLimits kv;  // --kv-cache-bytes, --max-batch-tokens, --max-num-seqs, --max-model-len
  int32_t max_queued = 256;
  double session_ttl = 600.0;
  std::string api_key;
  std::string api_key_file;
  int64_t max_body_bytes = int64_t(32) << 20;
  int threads = 0;
  int http_threads = 0;
  int max_json_depth = 256;
  double responses_store_ttl = 3600.0;
  int64_t responses_store_bytes = int64_t(64) << 20;
  double header_timeout = 10.0;
  int max_connections_per_address = 256;
  std::string scheduling_policy = "fcfs";
  bool no_prefix_caching = false;
  int64_t kv_host_bytes = 0;
  std::string kv_disk_dir;
  int64_t kv_disk_bytes = int64_t(4) << 30;
  double kv_flush_timeout = 10.0;
  std::string kv_redis_url;
  int64_t kv_redis_queue_bytes = int64_t(256) << 20;
  std::string checkpoint_store = "file";
  int32_t checkpoint_every = 0;
  int64_t checkpoint_queue_bytes = int64_t(64) << 20;
  std::string checkpoint_dir;
  std::string tool_parser = "auto";
  std::string task = "auto";
  std::vector<std::string> lora;  // NAME=DIR
  int32_t max_lora_rank = 0;
  bool allow_runtime_lora = false;
  std::string lora_dir;
  std::string kv_cache_dtype = "auto";
  std::string kv_config;
  std::string kv_quant_start = "auto";
  int32_t state_snapshot_interval = 512;
  int64_t state_snapshot_bytes = int64_t(256) << 20;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k, max_tokens;
  DeviceArgs dev;
  SpeculativeArgs spec;
  bool supervise = false;
  bool supervised_child = false;
  bool checkpoint_every_given = false;
  int max_restarts_per_minute = 5;
};

// The repository's demo model: $STRATA_MODEL, else models/strata-demo in a directory above
// the executable (build/strata -> ../models/strata-demo).
std::string default_model_dir() {
  if (const char* env = std::getenv("STRATA_MODEL"); env && *env) return env;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return "models/strata-demo";
  for (fs::path dir = exe.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    const fs::path candidate = dir / "models" / "strata-demo";
    if (fs::exists(candidate / "config.json", ec)) return candidate.string();
    if (dir == dir.root_path()) break;
  }
  return "models/strata-demo";
}

Result<std::string> read_key_file(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return make_error(ErrorCode::kIo, "--api-key-file: cannot read '" + path + "'");
  std::string s;
  char buf[256];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) s.append(buf, n);
  std::fclose(f);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
  if (s.empty()) return make_error(ErrorCode::kInvalidArgument, "--api-key-file '" + path + "' is empty");
  return s;
}

int fail(const Error& e) {
  log::error("{}", e.to_string());
  return e.code == ErrorCode::kInvalidArgument || e.code == ErrorCode::kUnsupported ? 2 : 1;
}

// --supervise: this process keeps the port and runs the engine in a child (server/supervisor.h).
// Streams resume from checkpoints, so they default to every 32 tokens, in a private directory
// when no --checkpoint-dir or --kv-disk-dir is given.
int run_supervised(const ServeArgs& a) {
  if (a.max_restarts_per_minute < 1) {
    return fail(make_error(ErrorCode::kInvalidArgument,
                           "--max-restarts-per-minute must be >= 1, got " + std::to_string(a.max_restarts_per_minute)));
  }
  std::vector<std::string> extra;
  const int32_t every = a.checkpoint_every_given ? a.checkpoint_every : 32;
  if (!a.checkpoint_every_given) extra = {"--checkpoint-every", "32"};
  server::SupervisorOptions so;
  if (every > 0 && a.checkpoint_dir.empty() && a.kv_disk_dir.empty()) {
    std::error_code ec;
    std::string pattern = (fs::temp_directory_path(ec) / "strata-checkpoints-XXXXXX").string();
    if (ec || !mkdtemp(pattern.data())) {
      return fail(make_error(ErrorCode::kIo, "--supervise: cannot create a checkpoint directory '" + pattern + "'"));
    }
    so.temp_dir = pattern;
    extra.insert(extra.end(), {"--checkpoint-dir", pattern});
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return fail(make_error(ErrorCode::kIo, "--supervise: cannot find this executable (/proc/self/exe)"));
  so.child_argv = server::child_command_line(server::own_command_line(), exe.string(), extra);
  so.host = a.host;
  so.port = a.port;
  so.api_key = a.api_key;
  so.max_body_bytes = size_t(a.max_body_bytes);
  so.http_threads = a.http_threads > 0 ? a.http_threads : a.kv.max_num_seqs + 8;
  so.listener.header_timeout_s = a.header_timeout;
  so.listener.max_connections_per_address = a.max_connections_per_address;
  so.max_restarts_per_minute = a.max_restarts_per_minute;
  so.stop_timeout_s = a.kv_flush_timeout + 30.0;
  return server::run_supervisor(so);
}

int run_serve(ServeArgs a) {
  if (a.model_dir.empty()) a.model_dir = default_model_dir();
  if (!a.api_key_file.empty()) {
    auto key = read_key_file(a.api_key_file);
    if (!key.ok()) return fail(key.error());
    a.api_key = *key;
  }
  if (a.max_body_bytes < 1024) return fail(make_error(ErrorCode::kInvalidArgument, "--max-body-bytes must be >= 1024, got " + std::to_string(a.max_body_bytes)));
  if (a.max_json_depth < 2 || a.max_json_depth > 100000) {
    return fail(make_error(ErrorCode::kInvalidArgument, "--max-json-depth must be in [2, 100000], got " + std::to_string(a.max_json_depth)));
  }
  if (!(a.responses_store_ttl >= 0.0 && a.responses_store_ttl <= 30.0 * 86400.0)) {
    return fail(make_error(ErrorCode::kInvalidArgument, "--responses-store-ttl must be in [0, 2592000] seconds, got " + std::to_string(a.responses_store_ttl)));
  }
  if (a.responses_store_bytes < 0) {
    return fail(make_error(ErrorCode::kInvalidArgument, "--responses-store-bytes must be >= 0, got " + std::to_string(a.responses_store_bytes)));
  }
  if (!(a.header_timeout > 0.0 && a.header_timeout <= 3600.0)) {
    return fail(make_error(ErrorCode::kInvalidArgument, "--header-timeout must be in (0, 3600] seconds, got " + std::to_string(a.header_timeout)));
  }
  if (a.max_connections_per_address < 0) {
    return fail(make_error(ErrorCode::kInvalidArgument, "--max-connections-per-address must be >= 0 (0: no limit), got " +
                                                            std::to_string(a.max_connections_per_address)));
  }
  if (a.port < 0 || a.port > 65535) return fail(make_error(ErrorCode::kInvalidArgument, "--port must be in [0, 65535], got " + std::to_string(a.port)));
  auto quant_start = parse_kv_quant_start(a.kv_quant_start);
  if (!quant_start.ok()) return fail(quant_start.error());
  auto kv_codecs = make_kv_codec_config(a.kv_cache_dtype, a.kv_config, *quant_start);
  if (!kv_codecs.ok()) return fail(kv_codecs.error());
  if (a.state_snapshot_interval < 1) {
    return fail(make_error(ErrorCode::kInvalidArgument,
                           "--state-snapshot-interval must be >= 1, got " + std::to_string(a.state_snapshot_interval)));
  }
  {
    ThreadPool none(1);
    auto spec = make_speculative_options(a.spec, a.model_dir, none, /*load=*/false);
    if (!spec.ok()) return fail(spec.error());
  }
  if (a.allow_runtime_lora && a.lora_dir.empty()) {
    return fail(make_error(ErrorCode::kInvalidArgument, "--allow-runtime-lora needs --lora-dir (the directory adapters load from)"));
  }
  if (!a.lora_dir.empty() && !fs::is_directory(a.lora_dir)) {
    return fail(make_error(ErrorCode::kInvalidArgument, "--lora-dir '" + a.lora_dir + "' is not a directory"));
  }
  PoolingConfig pooling;
  auto embed = resolve_embed_task(a.task, a.model_dir, &pooling);
  if (!embed.ok()) return fail(embed.error());
  a.dev.embed = *embed;
  if (a.dev.embed && a.dev.device == "auto") a.dev.device = "cpu";
  if (a.supervise) return run_supervised(a);

  // SIGINT/SIGTERM go to one waiting thread; block them before any other thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ::signal(SIGPIPE, SIG_IGN);  // a vanished client is a failed write, not a dead server

  ThreadPool pool(a.threads);
  EngineOptions device_eo;  // what --device cuda sizes its pool and scratch by
  static_cast<KvLimits&>(device_eo) = a.kv;
  device_eo.kv_codecs = *kv_codecs;
  device_eo.kv_host_bytes = a.kv_host_bytes;  // tiers keep --kv-quant-start auto at 0
  device_eo.kv_disk_dir = a.kv_disk_dir;
  device_eo.kv_redis_url = a.kv_redis_url;
  device_eo.speculative.method = a.spec.method;  // verifies size the device's logit rows
  device_eo.speculative.num_draft_tokens = a.spec.num_draft_tokens;
  auto model = load_engine_model(a.dev, a.model_dir, pool, &device_eo);
  if (!model.ok()) return fail(model.error());
  const ModelConfig cfg = model->model->config();
  std::string name = a.served_model_name;
  if (name.empty()) name = fs::path(a.model_dir).lexically_normal().filename().string();
  if (name.empty()) name = fs::path(a.model_dir).lexically_normal().parent_path().filename().string();
  std::map<std::string, int32_t> lora_slots;
  if (!a.lora.empty() && model->executor) {
    return fail(make_error(ErrorCode::kUnsupported, "--lora runs on --device cpu only so far (the GPU executor applies no adapter)"));
  }
  for (const std::string& spec : a.lora) {
    const auto eq = spec.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == spec.size()) {
      return fail(make_error(ErrorCode::kInvalidArgument, "--lora must be NAME=DIR, got '" + spec + "'"));
    }
    const std::string lname = spec.substr(0, eq), ldir = spec.substr(eq + 1);
    if (lname == name || lora_slots.count(lname)) {
      return fail(make_error(ErrorCode::kInvalidArgument, "--lora name '" + lname + "' is taken (the served model or another adapter)"));
    }
    auto adapter = model->model->load_lora(ldir, a.max_lora_rank);
    if (!adapter.ok()) return fail(adapter.error());
    lora_slots[lname] = model->model->add_lora(*adapter);
    log::info("LoRA adapter {} from {} (rank up to {})", lname, ldir, (*adapter)->max_rank);
  }

  EngineOptions eo;
  static_cast<KvLimits&>(eo) = a.kv;
  eo.max_queued = a.max_queued;
  eo.session_ttl_s = a.session_ttl;
  eo.kv_host_bytes = a.kv_host_bytes;
  eo.kv_disk_dir = a.kv_disk_dir;
  eo.kv_disk_bytes = a.kv_disk_bytes;
  eo.kv_flush_timeout_s = a.kv_flush_timeout;
  eo.kv_redis_url = a.kv_redis_url;
  eo.kv_redis_queue_bytes = a.kv_redis_queue_bytes;
  eo.checkpoint_store = a.checkpoint_store;
  eo.checkpoint_every = a.checkpoint_every;
  eo.checkpoint_queue_bytes = a.checkpoint_queue_bytes;
  eo.checkpoint_dir = a.checkpoint_dir;
  eo.scheduling_policy = a.scheduling_policy;
  eo.prefix_caching = !a.no_prefix_caching;
  eo.model_identity = state_identity_for(*model, eo);
  eo.kv_codecs = *kv_codecs;
  eo.state_snapshot_interval = a.state_snapshot_interval;
  eo.state_snapshot_bytes = a.state_snapshot_bytes;
  eo.kv_codecs = device_eo.kv_codecs;  // bf16 on cuda
  eo.kv_blocks = device_eo.kv_blocks;  // the device pool on cuda
  eo.kv_quant_blocks = device_eo.kv_quant_blocks;  // the device's codec pool (--kv-quant-start)
  eo.async_scheduling = device_eo.async_scheduling;
  eo.lora_slots = lora_slots;
  auto spec = make_speculative_options(a.spec, a.model_dir, pool);
  if (!spec.ok()) return fail(spec.error());
  eo.speculative = std::move(spec).value();

  // The tokenizer decides which ids end a turn (<|im_end|>, <|eot_id|>, ...).
  const int32_t max_len_guess = a.kv.max_model_len > 0 ? a.kv.max_model_len : cfg.max_position;
  auto served = server::load_served_model(a.model_dir, name, cfg, max_len_guess, a.tool_parser);
  if (!served.ok()) return fail(served.error());
  if (a.dev.embed) {
    if (pooling.dimension > 0 && pooling.dimension != cfg.hidden) {
      return fail(make_error(ErrorCode::kInvalidArgument, a.model_dir + ": the Pooling module's word_embedding_dimension " +
                                                              std::to_string(pooling.dimension) + " differs from hidden_size " +
                                                              std::to_string(cfg.hidden)));
    }
    pooling.dimension = cfg.hidden;
    served->embedding = true;
    served->pooling = pooling;
  }
  eo.eos_ids = served->tokenizer.stop_ids(cfg.eos_ids);

  auto engine = Engine::create(std::move(model->model), eo, std::move(model->executor));
  if (!engine.ok()) {
    Error e = engine.error();
    // A refused flag names itself; a model the engine cannot page names the model.
    if (e.code == ErrorCode::kUnsupported && e.message.rfind("--", 0) != 0) {
      e.message = "strata serve cannot serve " + a.model_dir + ": " + e.message;
    }
    return fail(e);
  }
  served->max_model_len = (*engine)->max_model_len();
  served->cli.temperature = a.temperature;
  served->cli.top_p = a.top_p;
  served->cli.top_k = a.top_k;
  served->cli.min_p = a.min_p;
  served->cli.repetition_penalty = a.repetition_penalty;
  served->cli.max_tokens = a.max_tokens;
  (*engine)->start();

  server::HttpOptions ho;
  ho.host = a.host;
  ho.port = a.port;
  ho.api_key = a.api_key;
  ho.device = model->device;
  ho.max_body_bytes = size_t(a.max_body_bytes);
  ho.http_threads = a.http_threads > 0 ? a.http_threads : a.kv.max_num_seqs + 8;
  ho.supervised = a.supervised_child;
  ho.max_json_depth = a.max_json_depth;
  ho.allow_runtime_lora = a.allow_runtime_lora;
  ho.lora_dir = a.lora_dir;
  ho.max_lora_rank = a.max_lora_rank;
  ho.responses_store_ttl_s = a.responses_store_ttl;
  ho.responses_store_bytes = size_t(a.responses_store_bytes);
  ho.listener.header_timeout_s = a.header_timeout;
  // A supervised child's every peer is its supervisor, which budgets its clients' addresses.
  ho.listener.max_connections_per_address = a.supervised_child ? 0 : a.max_connections_per_address;
  if (a.supervised_child) {
    if (const char* secret = std::getenv(server::kSupervisorSecretEnv)) ho.supervisor_secret = secret;
    unsetenv(server::kSupervisorSecretEnv);
  }
  server::HttpServer http(**engine, *served, ho);
  auto port = http.bind();
  if (!port.ok()) return fail(port.error());

  // One stop() is lost when the signal lands after bind() but before the listener runs (the
  // listener would then serve on): stop() repeats until run() has returned.
  std::atomic<bool> listener_done{false};
  std::thread waiter([&http, &listener_done, signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    if (listener_done.load()) return;
    log::info("signal {}: shutting down", sig);
    while (!listener_done.load()) {
      http.stop();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  const int32_t converts_past = (*engine)->options().kv_codecs.quant_start;
  log::info("serving {} on {} ({}, {} KV blocks of {} tokens, KV {} ({} bytes/token){}, max_model_len {}, tool calls: {}{})",
            name, model->device, cfg.model_type, (*engine)->n_kv_blocks(), (*engine)->block_size(), codec_namespace(eo.kv_codecs),
            (*engine)->kv_bytes_per_token(),
            converts_past > 0 ? "; exact until " + std::to_string(converts_past) + " tokens, then full blocks in " +
                                  std::to_string((*engine)->n_kv_quant_blocks()) + " codec blocks"
                            : std::string(),
            served->max_model_len,
            server::tool_call_format_name(served->tool_format),
            std::string(served->reasoning ? ", reasoning" : "") +
                (served->embedding ? ", embeddings: last-token pooling" + std::string(served->pooling.normalize ? ", normalized" : "")
                                   : std::string()));
  // Under --supervise a stopped engine loop (a device fault) ends this process: the
  // supervisor restarts it and re-sends what was in flight.
  std::atomic<bool> serving{true};
  std::thread engine_watch;
  if (a.supervised_child) {
    engine_watch = std::thread([&serving, &engine] {
      while (serving.load()) {
        if (!(*engine)->alive()) {
          log::error("the engine loop stopped: exiting for the supervisor to restart the engine process");
          std::this_thread::sleep_for(std::chrono::milliseconds(200));  // streams send their "lost" part
          std::_Exit(3);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }
  std::printf("strata serve: listening on http://%s:%d\n", a.host.c_str(), *port);
  std::fflush(stdout);
  const bool ok = http.run();
  listener_done = true;
  serving = false;
  if (engine_watch.joinable()) engine_watch.join();
  (*engine)->shutdown();
  // Wake the signal thread if the listener ended on its own.
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  return ok ? 0 : 1;
}

}  // namespace

void register_serve(CLI::App& app) {
  auto a = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over the OpenAI and Anthropic HTTP APIs");
  cmd->add_option("--model", a->model_dir, "Model directory (default: $STRATA_MODEL, else the repository's models/strata-demo)");
  cmd->add_option("--host", a->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", a->port, "Port (0: any free port, printed on stdout)")->capture_default_str();
  cmd->add_option("--served-model-name", a->served_model_name, "Name clients use in 'model' (default: the directory name)");
  cmd->add_option("--kv-cache-bytes", a->kv.kv_cache_bytes, "Bytes of KV cache")->capture_default_str();
  cmd->add_option("--max-batch-tokens", a->kv.max_batch_tokens, "Token budget of one engine step")->capture_default_str();
  cmd->add_option("--max-num-seqs", a->kv.max_num_seqs, "Sequences (and streams) running at once")->capture_default_str();
  cmd->add_option("--max-model-len", a->kv.max_model_len, "Prompt + generated tokens at most (0: the model's maximum)");
  cmd->add_option("--max-queued", a->max_queued, "Requests waiting for admission; past it: 429")->capture_default_str();
  cmd->add_option("--session-ttl", a->session_ttl, "Seconds a session's idle KV blocks stay pinned")->capture_default_str();
  cmd->add_option("--api-key", a->api_key, "Require Authorization: Bearer KEY (or x-api-key) on every endpoint but /health");
  cmd->add_option("--api-key-file", a->api_key_file, "Read the API key from a file");
  cmd->add_option("--max-body-bytes", a->max_body_bytes, "Largest request body; larger ones answer 413")->capture_default_str();
  cmd->add_option("--threads", a->threads, "Compute threads (0: one per hardware thread)");
  cmd->add_option("--http-threads", a->http_threads, "HTTP worker threads (0: max-num-seqs + 8)");
  cmd->add_option("--max-json-depth", a->max_json_depth, "JSON nested deeper than this answers 400 (body and JSON strings in it)")
      ->capture_default_str();
  cmd->add_option("--responses-store-ttl", a->responses_store_ttl,
                  "Seconds a stored /v1/responses answer can be continued (previous_response_id)")
      ->capture_default_str();
  cmd->add_option("--responses-store-bytes", a->responses_store_bytes,
                  "Bytes all stored /v1/responses answers may hold; the oldest go first (0: none stored)")
      ->capture_default_str();
  cmd->add_option("--header-timeout", a->header_timeout,
                  "Seconds a connection has to send its request head (and a short body) before it is answered 408")
      ->capture_default_str();
  cmd->add_option("--max-connections-per-address", a->max_connections_per_address,
                  "Open connections one client address may hold; more answer 429 (0: no limit)")
      ->capture_default_str();
  cmd->add_option("--scheduling-policy", a->scheduling_policy, "fcfs or priority")->capture_default_str();
  cmd->add_flag("--no-prefix-caching", a->no_prefix_caching, "Turn the prefix cache off");
  cmd->add_option("--kv-host-bytes", a->kv_host_bytes, "Bytes of host memory for KV blocks evicted from the pool (0: no host tier)")
      ->capture_default_str();
  cmd->add_option("--kv-disk-dir", a->kv_disk_dir, "Directory of the disk KV tier (survives restarts; empty: none)");
  cmd->add_option("--kv-disk-bytes", a->kv_disk_bytes, "Bytes the disk KV tier's files may take; oldest go first")
      ->capture_default_str();
  cmd->add_option("--kv-flush-timeout", a->kv_flush_timeout, "Seconds shutdown (SIGTERM) waits for the disk KV writer")
      ->capture_default_str();
  cmd->add_option("--kv-redis-url", a->kv_redis_url,
                  "redis://[[user]:password@]host[:port][/db]: a KV tier in Redis shared by replicas of the same "
                  "model, under the host and disk tiers (empty: none)");
  cmd->add_option("--kv-redis-queue-bytes", a->kv_redis_queue_bytes,
                  "Bytes of KV blocks waiting for the Redis writer at most; past it blocks are dropped (counted)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), std::numeric_limits<int64_t>::max()));
  cmd->add_option("--checkpoint-store", a->checkpoint_store,
                  "Where generation checkpoints go: file (--checkpoint-dir) or redis (the --kv-redis-url server, "
                  "so another replica resumes the request)")
      ->capture_default_str()
      ->check(CLI::IsMember({"file", "redis"}));
  cmd->add_option("--checkpoint-every", a->checkpoint_every,
                  "Every N generated tokens a request checkpoints (KV via the disk tier); an identical request "
                  "after a restart resumes there (0: off)")
      ->capture_default_str()
      ->check(CLI::Validator(
          [](std::string& v) { return v.find('-') == std::string::npos ? std::string() : "must be >= 0, got " + v; },
          "N >= 0"));
  cmd->add_option("--checkpoint-queue-bytes", a->checkpoint_queue_bytes,
                  "Bytes of checkpoints waiting for the writer thread at most; past it a checkpoint is dropped "
                  "(counted in strata_checkpoints_total{result=\"dropped\"}) and the next one carries on")
      ->capture_default_str()
      ->check(CLI::Range(int64_t(1), std::numeric_limits<int64_t>::max()));
  cmd->add_option("--checkpoint-dir", a->checkpoint_dir, "Directory of generation checkpoints (empty: <kv-disk-dir>/checkpoints)");
  cmd->add_option("--lora", a->lora,
                  "NAME=DIR: serve the PEFT LoRA adapter in DIR; a request whose model is NAME runs on it "
                  "(repeatable; adapters batch with each other and the base model; --device cpu)");
  cmd->add_option("--max-lora-rank", a->max_lora_rank, "Refuse adapters of a higher rank (0: any)")->capture_default_str();
  cmd->add_flag("--allow-runtime-lora", a->allow_runtime_lora,
                "Answer POST /v1/load_lora_adapter {lora_name, lora_path} and /v1/unload_lora_adapter {lora_name} "
                "(behind --api-key; paths inside --lora-dir)");
  cmd->add_option("--lora-dir", a->lora_dir, "The directory run-time adapter paths must lie in (--allow-runtime-lora)");
  cmd->add_option("--task", a->task,
                  "auto, generate or embed: embed serves /v1/embeddings (last-token pooling; auto: when the model "
                  "directory has sentence-transformers modules with a Pooling module)")
      ->capture_default_str();
  cmd->add_option("--tool-parser", a->tool_parser, "auto, hermes, llama3, deepseek, qwen3_coder, mistral, gemma4 or none")->capture_default_str();
  cmd->add_option("--kv-cache-dtype", a->kv_cache_dtype, "KV codec of every layer: auto, bf16, fp8, int8, int4 or turbo")
      ->capture_default_str();
  cmd->add_option("--kv-config", a->kv_config,
                  "JSON list of per-layer KV codecs: {layer_idx, codec, group_size?} or MLX's {layer_idx, bits, group_size}");
  cmd->add_option("--kv-quant-start", a->kv_quant_start, "Tokens a sequence keeps in exact KV before its full blocks move to the KV codec; auto: one block where the engine can convert (the block being written stays exact), 0: every row in the codec")
      ->capture_default_str();
  cmd->add_option("--state-snapshot-interval", a->state_snapshot_interval,
                  "Tokens between recurrent-state snapshots for prefix caching (a multiple of 64 and of the block size)")
      ->capture_default_str();
  cmd->add_option("--state-snapshot-bytes", a->state_snapshot_bytes,
                  "Host bytes for recurrent-state snapshots; with --kv-disk-dir the oldest go to disk")
      ->capture_default_str();
  cmd->add_option("--temperature", a->temperature, "Default temperature (request > flag > generation_config.json)");
  cmd->add_option("--top-p", a->top_p, "Default top_p");
  cmd->add_option("--top-k", a->top_k, "Default top_k");
  cmd->add_option("--min-p", a->min_p, "Default min_p");
  cmd->add_option("--repetition-penalty", a->repetition_penalty, "Default repetition_penalty");
  cmd->add_option("--max-tokens", a->max_tokens, "Default max_tokens (default: the rest of the context)");
  add_device_flags(cmd, a->dev);
  add_speculative_flags(cmd, a->spec);
  cmd->add_flag("--supervise", a->supervise,
                "Run the engine in a child process that is restarted when it dies; streams resume from their "
                "checkpoints (--checkpoint-every defaults to 32)");
  cmd->add_option("--max-restarts-per-minute", a->max_restarts_per_minute,
                  "Under --supervise: engine restarts allowed within a minute before the server gives up")
      ->capture_default_str();
  cmd->add_flag("--supervised-child", a->supervised_child, "The engine process of --supervise")->group("");
  cmd->callback([a, cmd] {
    a->checkpoint_every_given = cmd->count("--checkpoint-every") > 0;
    exit_code() = run_serve(*a);
  });
}

}  // namespace strata::cli
