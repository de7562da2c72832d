// Qwen3: Llama with a per-head RMSNorm (w) on q and k before RoPE; head_dim may differ from
// hidden / heads.
#include "model/decoder.h"
#include "model/families.h"

namespace strata {

Result<DecoderSpec> qwen3_decoder_spec(const ModelConfig& cfg) {
  DecoderSpec spec;
  spec.qk_norm = true;
  spec.qkv_bias = cfg.attention_bias;
  spec.o_bias = cfg.attention_bias;
  auto act = activation_from_name(cfg.hidden_act);
  if (!act.ok()) return act.error();
  spec.act = *act;
  return spec;
}

Result<std::unique_ptr<Model>> load_qwen3(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  auto spec = qwen3_decoder_spec(cfg);
  if (!spec.ok()) return spec.error();
  return load_decoder(cfg, weights, pool, *spec);
}

}  // namespace strata
