// Qwen3-MoE: Qwen3 attention; sparse layers route each token to num_experts_per_tok of
// num_experts SiLU MLPs (router softmax in f32, top-k, renormalized when norm_topk_prob).
// Layers in mlp_only_layers, or off the decoder_sparse_step grid, keep a dense MLP.
#include "model/decoder.h"
#include "model/families.h"

namespace strata {

Result<DecoderSpec> qwen3_moe_decoder_spec(const ModelConfig& cfg) {
  if (cfg.n_experts <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "qwen3_moe config needs num_experts (or num_local_experts) > 0");
  }
  auto spec = qwen3_decoder_spec(cfg);
  if (!spec.ok()) return spec.error();
  spec->moe = true;
  return spec;
}

Result<std::unique_ptr<Model>> load_qwen3_moe(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  auto spec = qwen3_moe_decoder_spec(cfg);
  if (!spec.ok()) return spec.error();
  return load_decoder(cfg, weights, pool, *spec);
}

}  // namespace strata
