#include "runtime/cuda/cuda_family.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "model/decoder.h"
#include "model/gemma4_config.h"
#include "model/registry.h"

namespace strata::cuda {

namespace {

Status check_moe(const ModelConfig& cfg) {
  if (cfg.n_experts_per_tok <= 0 || cfg.n_experts_per_tok > cfg.n_experts || cfg.n_experts_per_tok > 64) {
    return make_error(ErrorCode::kInvalidArgument, "num_experts_per_tok " + std::to_string(cfg.n_experts_per_tok) +
                                                       " must lie in [1, min(num_experts " + std::to_string(cfg.n_experts) + ", 64)]");
  }
  if (cfg.n_experts > 4096) return make_error(ErrorCode::kUnsupported, "num_experts " + std::to_string(cfg.n_experts) + " (the CUDA routing takes at most 4096)");
  return Status();
}

}  // namespace

FamilyFlags flags_of(const DecoderSpec& spec) {
  FamilyFlags f;
  f.qk_norm = spec.qk_norm;
  f.qkv_bias = spec.qkv_bias;
  f.o_bias = spec.o_bias;
  f.one_plus_w = spec.norm_one_plus_w;
  f.sandwich = spec.sandwich_norms;
  f.moe = spec.moe;
  f.embed_scale = spec.embed_scale;
  f.attn_scale = spec.attn_scale;
  f.attn_softcap = spec.attn_softcap;
  f.final_softcap = spec.final_softcap;
  return f;
}

Result<FamilyFlags> family_flags(const ModelConfig& cfg) {
  FamilyFlags f;
  const ModelFamily* family = find_model_family(cfg.model_type);
  if (family != nullptr && family->decoder_spec != nullptr) {
    // The shared decoder's families: the family's own DecoderSpec (model/<family>.cpp).
    auto spec = family->decoder_spec(cfg);
    if (!spec.ok()) return spec.error();
    f = flags_of(*spec);
    if (f.moe) {
      STRATA_RETURN_IF_ERROR(check_moe(cfg));
      if (cfg.moe_intermediate <= 0) return make_error(ErrorCode::kInvalidArgument, "moe_intermediate_size must be positive");
    }
  } else if (cfg.model_type == "gemma4_text") {
    auto g4 = parse_gemma4_text_config(cfg);
    if (!g4.ok()) return g4.error();
    if (cfg.attention_bias) return make_error(ErrorCode::kUnsupported, "gemma4_text: attention_bias true is not supported");
    // As load_gemma4_text: an absent activation key means gelu_pytorch_tanh.
    const bool act_given = cfg.text_json->contains("hidden_activation") || cfg.text_json->contains("hidden_act");
    if (act_given && cfg.hidden_act != "gelu_pytorch_tanh" && cfg.hidden_act != "gelu_tanh") {
      return make_error(ErrorCode::kUnsupported, "gemma4_text: hidden_activation '" + cfg.hidden_act + "' is not supported (gelu_pytorch_tanh)");
    }
    f.gemma4 = true;
    f.qk_norm = true;
    f.sandwich = true;
    f.embed_scale = float(std::sqrt(double(cfg.hidden)));
    f.attn_scale = 1.0f;  // the q and k norms set the scale
    f.final_softcap = cfg.final_softcap;
    f.moe = g4->moe;
  } else if (cfg.model_type == "qwen3_next" || cfg.model_type == "qwen3_5_text" || cfg.model_type == "qwen3_5_moe_text") {
    f.hybrid = true;
    f.qk_norm = true;
    f.one_plus_w = true;
    f.moe = cfg.model_type == "qwen3_5_moe_text" || (cfg.model_type == "qwen3_next" && cfg.n_experts > 0);
    if (cfg.attention_bias) return make_error(ErrorCode::kUnsupported, cfg.model_type + ": attention_bias true is not supported by the CUDA forward");
    if (f.moe) {
      if (cfg.n_experts <= 0) return make_error(ErrorCode::kInvalidArgument, cfg.model_type + " config needs num_experts > 0");
      STRATA_RETURN_IF_ERROR(check_moe(cfg));
      if (cfg.moe_intermediate <= 0 || cfg.shared_expert_intermediate <= 0) {
        return make_error(ErrorCode::kInvalidArgument, "moe_intermediate_size and shared_expert_intermediate_size must be positive");
      }
    }
  } else {
    return make_error(ErrorCode::kUnsupported, "model_type '" + cfg.model_type +
                                                   "' has no CUDA forward yet (llama, mistral, qwen2, qwen3, qwen3_moe, gemma2, gemma3_text, gemma4_text, "
                                                   "qwen3_next, qwen3_5_text, qwen3_5_moe_text)");
  }
  if (cfg.mlp_bias) return make_error(ErrorCode::kUnsupported, "mlp_bias is not supported by the CUDA forward");
  return f;
}

bool layer_sparse(const ModelConfig& c, int64_t l) {
  return c.model_type == "qwen3_moe" && c.n_experts > 0 &&
         std::find(c.mlp_only_layers.begin(), c.mlp_only_layers.end(), int32_t(l)) == c.mlp_only_layers.end() &&
         (l + 1) % std::max(1, c.decoder_sparse_step) == 0;
}


}  // namespace strata::cuda
