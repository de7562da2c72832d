// Gemma 2: (1 + w) RMSNorm, sandwich norms around attention and MLP, GELU-tanh, embedding
// scaled by sqrt(hidden) (as an f32 value: the compute dtype), attention scaled by
// query_pre_attn_scalar^-0.5 and soft-capped, final logits soft-capped, sliding-window layers
// per layer_types.
#include <cmath>

#include "model/decoder.h"
#include "model/families.h"

namespace strata {

Result<DecoderSpec> gemma2_decoder_spec(const ModelConfig& cfg) {
  DecoderSpec spec;
  spec.norm_one_plus_w = true;
  spec.sandwich_norms = true;
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
  return spec;
}

Result<std::unique_ptr<Model>> load_gemma2(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  auto spec = gemma2_decoder_spec(cfg);
  if (!spec.ok()) return spec.error();
  return load_decoder(cfg, weights, pool, *spec);
}

}  // namespace strata
