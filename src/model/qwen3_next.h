// The gated-DeltaNet hybrid families: qwen3_next, qwen3_5_text and qwen3_5_moe_text.
//
// Layers are either linear attention (DeltaNetLayer, state in the sequence's StateStorage
// slot, no KV) or full attention (GatedAttentionLayer, paged KV), per config layer_types.
// Every RMSNorm but the DeltaNet output norm scales by (1 + w). The feed-forward is a dense
// gated MLP (qwen3_5_text, and qwen3_next's mlp_only_layers) or a sparse MoE plus a shared
// expert scaled by sigmoid(shared_expert_gate(x)).
//
// Differences between the families, all in how weights are stored or routed:
//   qwen3_next        fused in_proj_qkvz / in_proj_ba grouped per key head; norm_topk_prob
//                     from the config; MoE per decoder_sparse_step / mlp_only_layers
//   qwen3_5_text      split in_proj_qkv / in_proj_z / in_proj_b / in_proj_a; dense MLP
//   qwen3_5_moe_text  split projections; every layer MoE; top-k weights always renormalized
#pragma once

#include <memory>

#include "core/status.h"
#include "model/model.h"
#include "model/weight_loader.h"

namespace strata {

enum class HybridFamily { kQwen3Next, kQwen35, kQwen35Moe };

// Sets cfg->layer_types from full_attention_interval (default 4: every fourth layer full
// attention) when the config lists none, as older qwen3_next configs do; errors name the key.
Status resolve_hybrid_layer_types(ModelConfig* cfg);

// `weights` is prefixed with the config's weight prefix (e.g. "model.").
Result<std::unique_ptr<Model>> load_qwen3_next_family(const ModelConfig& cfg, const WeightLoader& weights,
                                                      ThreadPool& pool, HybridFamily family);

// Registry entry points (model/families.h's ModelLoadFn).
Result<std::unique_ptr<Model>> load_qwen3_next(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);
Result<std::unique_ptr<Model>> load_qwen3_5(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);      // qwen3_5_text
Result<std::unique_ptr<Model>> load_qwen3_5_moe(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);  // qwen3_5_moe_text

}  // namespace strata
