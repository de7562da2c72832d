// qwen3_5_text and qwen3_5_moe_text: the Qwen3-Next layer stack with split DeltaNet input
// projections (model/qwen3_next.h lists the differences). Text positions only: with one
// position per token the three M-RoPE sections all rotate by that position, which is plain
// RoPE.
#include "model/qwen3_next.h"

namespace strata {

Result<std::unique_ptr<Model>> load_qwen3_5(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  return load_qwen3_next_family(cfg, weights, pool, HybridFamily::kQwen35);
}

Result<std::unique_ptr<Model>> load_qwen3_5_moe(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool) {
  return load_qwen3_next_family(cfg, weights, pool, HybridFamily::kQwen35Moe);
}

}  // namespace strata
