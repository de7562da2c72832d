// Qwen2: Llama with biases on the q, k and v projections (none on o).
#include "model/decoder.h"
#include "model/families.h"

namespace strata {

Result<std::unique_ptr<Model>> load_qwen2(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  DecoderSpec spec;
  spec.qkv_bias = true;
  auto act = activation_from_name(cfg.hidden_act);
  if (!act.ok()) return act.error();
  spec.act = *act;
  return load_decoder(cfg, weights, pool, spec);
}

}  // namespace strata
