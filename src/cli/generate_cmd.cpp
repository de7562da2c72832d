// strata generate: one prompt through a model with a single-sequence cache, tokens streamed
// to stdout as they are sampled (ids, or text through the model's tokenizer), logs on stderr.
// Sampling settings: a flag wins over generation_config.json, which wins over the defaults.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/device.h"
#include "cli/speculative_args.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/registry.h"
#include "model/single_sequence.h"
#include "sampling/sampler.h"
#include "tokenizer/stream_decoder.h"
#include "tokenizer/tokenizer.h"

namespace strata::cli {

namespace {

struct GenerateArgs {
  std::string model_dir;
  std::string prompt_ids;
  std::string prompt;
  int32_t max_tokens = 128;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  float presence_penalty = 0.0f, frequency_penalty = 0.0f;
  std::optional<uint64_t> seed;
  std::string output;  // "text" or "ids"; empty: text when the model has a tokenizer
  int threads = 0;
  bool ignore_eos = false;
  std::string kv_cache_dtype = "auto";
  std::string kv_config;
  std::string kv_quant_start = "auto";
  std::string lora;  // a PEFT adapter directory
  DeviceArgs dev;
  SpeculativeArgs spec;
};

Result<std::vector<int32_t>> parse_id_list(const std::string& s) {
  std::vector<int32_t> ids;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto b = item.find_first_not_of(" \t");
    const auto e = item.find_last_not_of(" \t");
    if (b == std::string::npos) return make_error(ErrorCode::kInvalidArgument, "--prompt-ids has an empty entry: '" + s + "'");
    const std::string tok = item.substr(b, e - b + 1);
    size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(tok, &used);
    } catch (...) {
      used = 0;
    }
    if (used != tok.size() || v < 0 || v > INT32_MAX) {
      return make_error(ErrorCode::kInvalidArgument, "--prompt-ids entry '" + tok + "' is not a token id");
    }
    ids.push_back(int32_t(v));
  }
  if (ids.empty()) return make_error(ErrorCode::kInvalidArgument, "--prompt-ids is empty");
  return ids;
}

SamplingParams sampling_from(const GenerateArgs& a, const ModelConfig& cfg) {
  SamplingParams p;
  if (cfg.default_do_sample == 0) p.temperature = 0.0f;  // generation_config asks for greedy
  else if (cfg.default_temperature >= 0.0f) p.temperature = cfg.default_temperature;
  if (cfg.default_top_k >= 0) p.top_k = cfg.default_top_k;
  if (cfg.default_top_p >= 0.0f) p.top_p = cfg.default_top_p;
  if (cfg.default_min_p >= 0.0f) p.min_p = cfg.default_min_p;
  if (cfg.default_repetition_penalty > 0.0f) p.repetition_penalty = cfg.default_repetition_penalty;
  if (a.temperature) p.temperature = *a.temperature;
  if (a.top_k) p.top_k = *a.top_k;
  if (a.top_p) p.top_p = *a.top_p;
  if (a.min_p) p.min_p = *a.min_p;
  if (a.repetition_penalty) p.repetition_penalty = *a.repetition_penalty;
  p.presence_penalty = a.presence_penalty;
  p.frequency_penalty = a.frequency_penalty;
  if (a.seed) {
    p.seed = *a.seed;
    p.has_seed = true;
  } else {
    p.seed = uint64_t(std::chrono::steady_clock::now().time_since_epoch().count());
  }
  return p;
}

int fail(const Error& e) {
  log::error("{}", e.to_string());
  return e.code == ErrorCode::kInvalidArgument ? 2 : 1;
}

// --device cuda: the prompt as one request through the engine on the GPU (CudaExecutor).
int run_generate_on_engine(const GenerateArgs& a, EngineModel m, EngineOptions eo, const std::vector<int32_t>& prompt_ids,
                           const std::optional<tokenizer::Tokenizer>& tok, const std::string& output) {
  const ModelConfig cfg = m.model->config();
  GenerationRequest r;
  r.id = "generate";
  r.prompt = prompt_ids;
  r.max_tokens = std::max(a.max_tokens, 1);
  r.sampling = sampling_from(a, cfg);
  r.ignore_eos = a.ignore_eos;
  if (!eo.lora_slots.empty()) r.adapter = "lora";
  if (tok) {
    r.stop_ids = tok->stop_ids(cfg.eos_ids);
    if (tok->vocab_size() < cfg.vocab_size) r.vocab_limit = tok->vocab_size();
  }
  eo.model_identity = state_identity_for(m, eo);
  auto engine = Engine::create(std::move(m.model), eo, std::move(m.executor));
  if (!engine.ok()) return fail(engine.error());
  (*engine)->start();
  const auto t0 = std::chrono::steady_clock::now();
  auto stream = (*engine)->submit(r);
  if (!stream.ok()) return fail(stream.error());
  std::optional<tokenizer::StreamDecoder> dec;
  if (output == "text") dec.emplace(*tok, /*skip_special=*/true);
  int32_t n = 0;
  std::optional<double> first_ms;
  StreamEvent last;
  for (;;) {
    auto e = (*stream)->next(std::chrono::milliseconds(600000));
    if (!e) return fail(make_error(ErrorCode::kInternal, "the engine gave no token for 600 s"));
    for (int32_t id : e->tokens) {
      if (!first_ms) first_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (dec) {
        const std::string d = dec->push(id);
        std::fwrite(d.data(), 1, d.size(), stdout);
      } else {
        std::printf(n == 0 ? "%d" : " %d", id);
      }
      ++n;
    }
    std::fflush(stdout);
    if (e->final) {
      last = *e;
      break;
    }
  }
  if (dec) {
    const std::string rest = dec->finish();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  std::printf("\n");
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  (*engine)->shutdown();
  if (last.finish_reason == FinishReason::kError) return fail(make_error(ErrorCode::kInternal, last.message));
  log::info("prompt {} tokens, first token after {:.1f} ms; generated {} tokens in {:.3f} s on {}; stop: {}", prompt_ids.size(),
            first_ms.value_or(0.0), n, total_s, m.device, finish_reason_name(last.finish_reason));
  if (last.usage.speculative) {
    log::info("speculation: {} drafted, {} accepted", last.usage.draft_tokens, last.usage.accepted_tokens);
  }
  return 0;
}

int run_generate(const GenerateArgs& a) {
  if (a.max_tokens < 0) return fail(make_error(ErrorCode::kInvalidArgument, "--max-tokens must be >= 0"));
  auto quant_start = parse_kv_quant_start(a.kv_quant_start);
  if (!quant_start.ok()) return fail(quant_start.error());
  auto kv_codecs = make_kv_codec_config(a.kv_cache_dtype, a.kv_config, *quant_start);
  if (!kv_codecs.ok()) return fail(kv_codecs.error());
  if (a.prompt_ids.empty() == a.prompt.empty()) {
    return fail(make_error(ErrorCode::kInvalidArgument, "give exactly one of --prompt-ids and --prompt"));
  }
  std::string output = a.output;
  const bool has_tokenizer = std::filesystem::exists(std::filesystem::path(a.model_dir) / "tokenizer.json");
  if (output.empty()) output = has_tokenizer ? "text" : "ids";
  std::optional<tokenizer::Tokenizer> tok;
  if (has_tokenizer) {
    auto t = tokenizer::Tokenizer::load(a.model_dir);
    if (!t.ok()) return fail(t.error());
    tok = std::move(*t);
  } else if (!a.prompt.empty() || output == "text") {
    return fail(make_error(ErrorCode::kNotFound, "--prompt and --output text need a tokenizer, and " + a.model_dir +
                                                     " has no tokenizer.json; use --prompt-ids and --output ids"));
  }
  std::vector<int32_t> prompt_ids;
  if (!a.prompt.empty()) {
    auto ids = tok->encode(a.prompt, /*add_special=*/true);
    if (!ids.ok()) return fail(ids.error());
    prompt_ids = std::move(*ids);
    if (prompt_ids.empty()) return fail(make_error(ErrorCode::kInvalidArgument, "--prompt encodes to no tokens"));
  } else {
    auto ids = parse_id_list(a.prompt_ids);
    if (!ids.ok()) return fail(ids.error());
    prompt_ids = std::move(*ids);
  }
  ThreadPool pool(a.threads);
  const auto t0 = std::chrono::steady_clock::now();
  EngineOptions eo;  // --device cuda: one sequence through the engine
  eo.max_num_seqs = 1;
  eo.max_model_len = int32_t(prompt_ids.size()) + std::max(a.max_tokens, 1);
  eo.kv_cache_bytes = int64_t(eo.max_model_len + 16) * 1024 * 1024;  // sized again by the device
  eo.kv_codecs = *kv_codecs;
  auto engine_model = load_engine_model(a.dev, a.model_dir, pool, &eo);
  if (!engine_model.ok()) return fail(engine_model.error());
  auto spec = make_speculative_options(a.spec, a.model_dir, pool);
  if (!spec.ok()) return fail(spec.error());
  eo.speculative = std::move(spec).value();
  int32_t lora_slot = -1;
  if (!a.lora.empty()) {
    if (engine_model->executor) {
      return fail(make_error(ErrorCode::kUnsupported, "--lora runs on --device cpu only so far (the GPU executor applies no adapter)"));
    }
    auto adapter = engine_model->model->load_lora(a.lora, 0);
    if (!adapter.ok()) return fail(adapter.error());
    lora_slot = engine_model->model->add_lora(*adapter);
    eo.lora_slots["lora"] = lora_slot;
  }
  // Speculation runs in the engine (on the CPU too).
  if (engine_model->executor || eo.speculative.method != "off") return run_generate_on_engine(a, std::move(engine_model).value(), eo, prompt_ids, tok, output);
  auto model = Result<std::unique_ptr<Model>>(std::move(engine_model->model));
  const ModelConfig& cfg = (*model)->config();
  const auto t1 = std::chrono::steady_clock::now();
  log::info("loaded {} ({}) in {:.1f} ms, {} threads", a.model_dir, cfg.model_type,
            std::chrono::duration<double, std::milli>(t1 - t0).count(), pool.size());

  // One sequence without the engine: every row in the codec from the start (auto means 0 here;
  // a count > 0 needs the engine's conversion and is refused).
  KvCodecConfig codecs = *kv_codecs;
  if (codecs.quant_start == KvCodecConfig::kQuantStartAuto) codecs.quant_start = 0;
  auto kv_layout = resolve_kv_layout(**model, codecs);
  if (!kv_layout.ok()) return fail(kv_layout.error());

  SamplingParams params = sampling_from(a, cfg);
  std::vector<int32_t> stop_ids = cfg.eos_ids;
  if (tok) {
    // The tokenizer adds its EOS and end-of-turn tokens; rows past its vocabulary are padding.
    stop_ids = tok->stop_ids(cfg.eos_ids);
    if (tok->vocab_size() < cfg.vocab_size) params.vocab_limit = tok->vocab_size();
  }
  auto sampler = Sampler::create(params, cfg.vocab_size, prompt_ids);
  if (!sampler.ok()) return fail(sampler.error());

  int64_t context = int64_t(prompt_ids.size()) + a.max_tokens;
  if (cfg.max_position > 0 && context > cfg.max_position) context = cfg.max_position;
  SingleSequence seq(**model, int32_t(std::max<int64_t>(context, 1)), 16, std::move(kv_layout).value());
  seq.set_adapter(lora_slot);
  auto logits = seq.prefill(prompt_ids);
  if (!logits.ok()) return fail(logits.error());
  const auto t2 = std::chrono::steady_clock::now();

  std::optional<tokenizer::StreamDecoder> stream;
  if (output == "text") stream.emplace(*tok, /*skip_special=*/true);
  int32_t n_generated = 0;
  bool first = true;
  std::string stop_reason = "length";
  while (n_generated < a.max_tokens) {
    const int32_t id = sampler->sample(logits->data(), cfg.vocab_size);
    sampler->accept(id);
    const bool is_eos = std::find(stop_ids.begin(), stop_ids.end(), id) != stop_ids.end();
    if (is_eos && !a.ignore_eos) {
      stop_reason = "eos";
      break;
    }
    if (stream) {
      const std::string delta = stream->push(id);
      std::fwrite(delta.data(), 1, delta.size(), stdout);
    } else {
      std::printf(first ? "%d" : " %d", id);
    }
    std::fflush(stdout);
    first = false;
    ++n_generated;
    if (n_generated == a.max_tokens) break;
    if (seq.position() >= seq.context()) {
      stop_reason = "context";
      break;
    }
    logits = seq.step(id);
    if (!logits.ok()) return fail(logits.error());
  }
  if (stream) {
    const std::string rest = stream->finish();
    std::fwrite(rest.data(), 1, rest.size(), stdout);
  }
  std::printf("\n");
  std::fflush(stdout);
  const auto t3 = std::chrono::steady_clock::now();
  const double prefill_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  const double decode_s = std::chrono::duration<double>(t3 - t2).count();
  log::info("prompt {} tokens in {:.1f} ms; generated {} tokens in {:.3f} s ({:.1f} tok/s); stop: {}", prompt_ids.size(), prefill_ms,
            n_generated, decode_s, decode_s > 0 ? n_generated / decode_s : 0.0, stop_reason);
  return 0;
}

}  // namespace

void register_generate(CLI::App& app) {
  auto args = std::make_shared<GenerateArgs>();
  CLI::App* cmd = app.add_subcommand("generate", "Generate tokens from a prompt");
  cmd->add_option("--model", args->model_dir, "Model directory (config.json + safetensors)")->required();
  cmd->add_option("--prompt-ids", args->prompt_ids, "Prompt as comma-separated token ids, used as given (no BOS added)");
  cmd->add_option("--prompt", args->prompt, "Prompt text (needs the model's tokenizer)");
  cmd->add_option("--max-tokens", args->max_tokens, "Tokens to generate at most")->capture_default_str();
  cmd->add_option("--temperature", args->temperature, "0: greedy");
  cmd->add_option("--top-k", args->top_k, "0: off");
  cmd->add_option("--top-p", args->top_p, "1: off");
  cmd->add_option("--min-p", args->min_p, "0: off");
  cmd->add_option("--seed", args->seed, "RNG seed");
  cmd->add_option("--repetition-penalty", args->repetition_penalty, "1: off");
  cmd->add_option("--presence-penalty", args->presence_penalty, "0: off");
  cmd->add_option("--frequency-penalty", args->frequency_penalty, "0: off");
  cmd->add_option("--output", args->output, "text or ids (default: text when the model has a tokenizer)")
      ->check(CLI::IsMember({"text", "ids"}));
  cmd->add_option("--threads", args->threads, "Worker threads (0: one per hardware thread)");
  cmd->add_flag("--ignore-eos", args->ignore_eos, "Do not stop at the model's EOS ids");
  cmd->add_option("--lora", args->lora, "A PEFT LoRA adapter directory to generate with (--device cpu)");
  add_device_flags(cmd, args->dev);
  add_speculative_flags(cmd, args->spec);
  cmd->add_option("--kv-cache-dtype", args->kv_cache_dtype, "KV codec of every layer: auto, bf16, fp8, int8, int4 or turbo")
      ->capture_default_str();
  cmd->add_option("--kv-config", args->kv_config,
                  "JSON list of per-layer KV codecs: {layer_idx, codec, group_size?} or MLX's {layer_idx, bits, group_size}");
  cmd->add_option("--kv-quant-start", args->kv_quant_start, "Tokens a sequence keeps in exact KV before its full blocks move to the KV codec; auto: one block where the engine can convert (the block being written stays exact), 0: every row in the codec")
      ->capture_default_str();
  cmd->callback([args] { exit_code() = run_generate(*args); });
}

}  // namespace strata::cli
