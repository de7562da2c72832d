// Qwen3-MoE: Qwen3 attention; sparse layers route each token to num_experts_per_tok of
// num_experts SiLU MLPs (router softmax in f32, top-k, renormalized when norm_topk_prob).
// Layers in mlp_only_layers, or off the decoder_sparse_step grid, keep a dense MLP.
#include "model/decoder.h"
#include "model/families.h"

namespace strata {

Result<std::unique_ptr<Model>> load_qwen3_moe(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  if (cfg.n_experts <= 0) {
    return make_error(ErrorCode::kInvalidArgument, "qwen3_moe config needs num_experts (or num_local_experts) > 0");
  }
  DecoderSpec spec;
  spec.qk_norm = true;
  spec.qkv_bias = cfg.attention_bias;
  spec.o_bias = cfg.attention_bias;
  spec.moe = true;
  auto act = activation_from_name(cfg.hidden_act);
  if (!act.ok()) return act.error();
  spec.act = *act;
  return load_decoder(cfg, weights, pool, spec);
}

}  // namespace strata
