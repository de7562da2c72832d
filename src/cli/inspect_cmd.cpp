// strata inspect: what a model directory holds, as strata reads it: family, shape, RoPE,
// parameter count, dtypes, the KV cache cost per token and the pools the engine would plan
// (kv/kv_plan.h) under the given limits.
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/quant.h"
#include "model/registry.h"

namespace strata::cli {

namespace {

int run_inspect(const std::string& dir, const EngineOptions& eo) {
  ThreadPool pool(1);
  auto model = load_model(dir, pool);
  if (!model.ok()) {
    log::error("{}", model.error().to_string());
    return 1;
  }
  const ModelConfig& c = (*model)->config();
  auto archive = SafetensorsArchive::open_dir(dir);
  if (!archive.ok()) {
    log::error("{}", archive.error().to_string());
    return 1;
  }
  // Parameters of the text model (a wrapper's vision tower is not loaded) and all tensors.
  int64_t params = 0, all_params = 0;
  std::map<std::string, int64_t> by_dtype;
  for (const auto& [name, t] : (*archive)->tensors()) {
    all_params += t.numel();
    const bool text = name.rfind(c.weight_prefix, 0) == 0 || name == c.lm_head_name;
    if (!text) continue;
    params += t.numel();
    by_dtype[dtype_name(t.dtype)] += t.numel();
  }
  const auto layout = (*model)->kv_layout();
  int n_sliding = 0, n_full = 0, n_other = 0;
  for (const auto& t : c.layer_types) {
    if (t == "sliding_attention") ++n_sliding;
    else if (t == "full_attention") ++n_full;
    else ++n_other;
  }
  std::printf("family:          %s%s\n", c.model_type.c_str(), c.wrapper_type.empty() ? "" : (" (in " + c.wrapper_type + ")").c_str());
  std::printf("layers:          %d (full %d, sliding %d, other %d)\n", c.n_layers, n_full, n_sliding, n_other);
  std::printf("hidden:          %d\n", c.hidden);
  std::printf("heads:           %d (kv %d, head_dim %d)\n", c.n_heads, c.n_kv_heads, c.head_dim);
  std::printf("intermediate:    %d\n", c.intermediate);
  if (c.n_experts > 0) std::printf("experts:         %d (top %d, moe_intermediate %d)\n", c.n_experts, c.n_experts_per_tok, c.moe_intermediate);
  std::printf("vocab:           %d\n", c.vocab_size);
  std::printf("max_position:    %d\n", c.max_position);
  if (c.sliding_window > 0) std::printf("sliding_window:  %d\n", c.sliding_window);
  std::printf("rope:            %s theta %g factor %g partial %g\n", c.rope.type.c_str(), c.rope.theta, c.rope.factor,
              c.rope.partial_rotary_factor);
  for (const auto& [type, r] : c.rope_by_layer_type) {
    std::printf("rope[%s]: %s theta %g factor %g partial %g\n", type.c_str(), r.type.c_str(), r.theta, r.factor,
                r.partial_rotary_factor);
  }
  std::printf("tied_embeddings: %s\n", c.tie_embeddings ? "yes" : "no");
  const WeightBytesPerToken wb = weight_bytes_per_token(c, **archive);
  std::printf("parameters:      %lld", static_cast<long long>(wb.parameters));
  if (all_params != params) std::printf(" (checkpoint total %lld)", static_cast<long long>(all_params));
  if (wb.parameters != params) std::printf(" (%lld stored elements)", static_cast<long long>(params));
  std::printf("\n");
  std::printf("dtypes:         ");
  for (const auto& [d, n] : by_dtype) std::printf(" %s %lld", d.c_str(), static_cast<long long>(n));
  std::printf("\n");
  std::printf("quantization:    %s\n", c.quant ? c.quant->describe().c_str() : "none");
  std::printf("weight_bytes/token: %lld as stored, %lld as held on the CPU", static_cast<long long>(wb.stored),
              static_cast<long long>(wb.resident));
  if (c.quant && c.quant->quantized()) std::printf(" (quantized), %lld dequantized to f32", static_cast<long long>(wb.loaded));
  std::printf("\n");
  std::printf("kv_bytes/token:  %lld (f32 cache)\n", static_cast<long long>(KvStorage::bytes_per_token(layout)));
  auto plan = describe_kv_plan(**model, eo);
  if (!plan.ok()) {
    log::error("{}", plan.error().to_string());
    return 1;
  }
  std::printf("kv_plan:         %s in %lld bytes, %d sequences\n", plan->c_str(), static_cast<long long>(eo.kv_cache_bytes),
              eo.max_num_seqs);
  std::printf("eos_ids:        ");
  for (int32_t id : c.eos_ids) std::printf(" %d", id);
  std::printf("\n");
  return 0;
}

}  // namespace

void register_inspect(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto eo = std::make_shared<EngineOptions>();
  CLI::App* cmd = app.add_subcommand("inspect", "Describe a model directory");
  cmd->add_option("--model", *dir, "Model directory")->required();
  cmd->add_option("--kv-cache-bytes", eo->kv_cache_bytes, "Bytes of KV cache the plan splits")->capture_default_str();
  cmd->add_option("--max-num-seqs", eo->max_num_seqs, "Sequences running at once")->capture_default_str();
  cmd->add_option("--max-batch-tokens", eo->max_batch_tokens, "Token budget of one engine step")->capture_default_str();
  cmd->add_option("--max-model-len", eo->max_model_len, "Prompt + generated tokens at most (0: the model's maximum)");
  cmd->add_option("--block-size", eo->block_size, "Tokens per KV block")->capture_default_str();
  cmd->callback([dir, eo] { exit_code() = run_inspect(*dir, *eo); });
}

}  // namespace strata::cli
