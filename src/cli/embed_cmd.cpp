// strata embed: texts through an embedding model (last-token pooling, as /v1/embeddings does,
// through the same request parsing and engine), one JSON array of floats per input on stdout.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/device.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "server/embeddings.h"
#include "server/request_mapping.h"

namespace strata::cli {

namespace {

struct EmbedArgs {
  std::string model_dir;
  std::vector<std::string> texts;
  std::string prompt_name;
  std::optional<std::string> prompt;
  int32_t dimensions = 0;
  int threads = 0;
  DeviceArgs dev;
};

int fail(const Error& e) {
  log::error("{}", e.to_string());
  return e.code == ErrorCode::kInvalidArgument || e.code == ErrorCode::kUnsupported ? 2 : 1;
}

int fail(const server::ApiError& e) {
  log::error("{}{}", e.param.empty() ? "" : e.param + ": ", e.message);
  return e.status < 500 ? 2 : 1;
}

int run_embed(EmbedArgs a) {
  if (a.texts.empty()) return fail(make_error(ErrorCode::kInvalidArgument, "give at least one TEXT to embed"));
  PoolingConfig pooling;
  auto embed = resolve_embed_task("embed", a.model_dir, &pooling);
  if (!embed.ok()) return fail(embed.error());
  a.dev.embed = true;
  if (a.dev.device == "auto") a.dev.device = "cpu";
  ThreadPool pool(a.threads);
  EngineOptions eo;
  auto m = load_engine_model(a.dev, a.model_dir, pool, &eo);
  if (!m.ok()) return fail(m.error());
  const ModelConfig cfg = m->model->config();
  auto served = server::load_served_model(a.model_dir, "embed", cfg, cfg.max_position);
  if (!served.ok()) return fail(served.error());
  pooling.dimension = cfg.hidden;
  served->embedding = true;
  served->pooling = pooling;
  eo.model_identity = state_identity_for(*m, eo);
  auto engine = Engine::create(std::move(m->model), eo, std::move(m->executor));
  if (!engine.ok()) return fail(engine.error());
  served->max_model_len = (*engine)->max_model_len();
  (*engine)->start();

  nlohmann::json body = {{"input", a.texts}};
  if (!a.prompt_name.empty()) body["prompt_name"] = a.prompt_name;
  if (a.prompt) body["prompt"] = *a.prompt;
  if (a.dimensions != 0) body["dimensions"] = a.dimensions;
  server::EmbeddingsRequest r;
  if (auto e = server::parse_embeddings_request(body, *served, server::ParseLimits{}, &r)) return fail(*e);
  std::vector<std::vector<float>> vectors;
  Usage usage;
  if (auto e = server::run_embeddings(**engine, *served, r, "embed", nullptr, &vectors, &usage)) return fail(*e);
  (*engine)->shutdown();
  for (const auto& v : vectors) {
    const std::string line = nlohmann::json(v).dump();
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
  log::info("{} inputs, {} tokens", vectors.size(), r.prompt_tokens);
  return 0;
}

}  // namespace

void register_embed(CLI::App& app) {
  auto args = std::make_shared<EmbedArgs>();
  CLI::App* cmd = app.add_subcommand("embed", "Embed texts with an embedding model (one JSON array per line)");
  cmd->add_option("--model", args->model_dir, "Model directory (config.json, safetensors, tokenizer)")->required();
  cmd->add_option("texts", args->texts, "Texts to embed")->required();
  cmd->add_option("--prompt-name", args->prompt_name,
                  "A prompt of config_sentence_transformers.json to put before every text (e.g. query)");
  cmd->add_option("--prompt", args->prompt, "Literal instruction text to put before every text");
  cmd->add_option("--dimensions", args->dimensions, "Keep the first N dimensions (then re-normalized); 0: all")
      ->capture_default_str();
  cmd->add_option("--threads", args->threads, "Worker threads (0: one per hardware thread)");
  add_device_flags(cmd, args->dev);
  cmd->callback([args] { exit_code() = run_embed(*args); });
}

}  // namespace strata::cli
