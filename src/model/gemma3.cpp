// Gemma 3 (text; also the text part of the Gemma3ForConditionalGeneration wrapper): Gemma 2's
// layer with (1 + w) per-head q/k norms before RoPE, RoPE theta per layer type (local for
// sliding layers, global for full ones), attention soft-cap only if the config sets one.
#include "model/decoder.h"
#include "model/families.h"

namespace strata {

Result<DecoderSpec> gemma3_decoder_spec(const ModelConfig& cfg) {
  auto spec = gemma2_decoder_spec(cfg);
  if (!spec.ok()) return spec.error();
  spec->qk_norm = true;
  return spec;
}

Result<std::unique_ptr<Model>> load_gemma3(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  auto spec = gemma3_decoder_spec(cfg);
  if (!spec.ok()) return spec.error();
  return load_decoder(cfg, weights, pool, *spec);
}

}  // namespace strata
