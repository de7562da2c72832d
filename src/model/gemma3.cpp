// Gemma 3 (text; also the text part of the Gemma3ForConditionalGeneration wrapper): Gemma 2's
// layer with (1 + w) per-head q/k norms before RoPE, RoPE theta per layer type (local for
// sliding layers, global for full ones), attention soft-cap only if the config sets one.
#include <cmath>

#include "model/decoder.h"
#include "model/families.h"

namespace strata {

Result<std::unique_ptr<Model>> load_gemma3(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  DecoderSpec spec;
  spec.norm_one_plus_w = true;
  spec.sandwich_norms = true;
  spec.qk_norm = true;
  spec.qkv_bias = cfg.attention_bias;
  spec.o_bias = cfg.attention_bias;
  spec.embed_scale = float(std::sqrt(double(cfg.hidden)));
  auto act = activation_from_name(cfg.hidden_act);
  if (!act.ok()) return act.error();
  spec.act = *act;
  const double scalar = cfg.query_pre_attn_scalar > 0 ? cfg.query_pre_attn_scalar : cfg.head_dim;
  spec.attn_scale = float(1.0 / std::sqrt(scalar));
  spec.attn_softcap = cfg.attn_softcap;
  spec.final_softcap = cfg.final_softcap;
  return load_decoder(cfg, weights, pool, spec);
}

}  // namespace strata
