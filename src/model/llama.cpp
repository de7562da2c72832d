// Llama and Mistral: RMSNorm (w), SiLU gated MLP, RoPE on q/k, optional attention/MLP biases.
#include "model/decoder.h"
#include "model/families.h"

namespace strata {

Result<DecoderSpec> llama_decoder_spec(const ModelConfig& cfg) {
  DecoderSpec spec;
  spec.qkv_bias = cfg.attention_bias;
  spec.o_bias = cfg.attention_bias;
  spec.mlp_bias = cfg.mlp_bias;
  auto act = activation_from_name(cfg.hidden_act);
  if (!act.ok()) return act.error();
  spec.act = *act;
  return spec;
}

Result<std::unique_ptr<Model>> load_llama(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  auto spec = llama_decoder_spec(cfg);
  if (!spec.ok()) return spec.error();
  return load_decoder(cfg, weights, pool, *spec);
}

}  // namespace strata
