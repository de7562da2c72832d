// Qwen2: Llama with biases on the q, k and v projections (none on o).
#include "model/decoder.h"
#include "model/families.h"

namespace strata {

Result<DecoderSpec> qwen2_decoder_spec(const ModelConfig& cfg) {
  DecoderSpec spec;
  spec.qkv_bias = true;
  auto act = activation_from_name(cfg.hidden_act);
  if (!act.ok()) return act.error();
  spec.act = *act;
  return spec;
}

Result<std::unique_ptr<Model>> load_qwen2(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  auto spec = qwen2_decoder_spec(cfg);
  if (!spec.ok()) return spec.error();
  return load_decoder(cfg, weights, pool, *spec);
}

}  // namespace strata
