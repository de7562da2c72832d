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
#include "model/weight_manifest.h"

namespace strata {

enum class HybridFamily { kQwen3Next, kQwen35, kQwen35Moe };

// Sets cfg->layer_types from full_attention_interval (default 4: every fourth layer full
// attention) when the config lists none, as older qwen3_next configs do; errors name the key.
Status resolve_hybrid_layer_types(ModelConfig* cfg);

// The family of a hybrid model_type; kUnsupported for any other.
Result<HybridFamily> hybrid_family(const std::string& model_type);

// Whether layer l routes to experts: every layer of qwen3_5_moe_text, qwen3_next's per
// decoder_sparse_step / mlp_only_layers, none of qwen3_5_text.
bool hybrid_layer_sparse(const ModelConfig& cfg, HybridFamily family, int64_t l);

// The hybrids' weight manifest for `cfg` (layer_types resolved). `checkpoint` (prefixed with the
// weight prefix) picks the experts' layout, one tensor per expert or fused 3-D tensors; a dummy
// model (null) gets the fused one. A checkpoint's LM head is tied exactly when cfg.lm_head_name
// is empty (resolve_weight_names), a dummy's when the config ties it. kInvalidArgument names a
// config field whose value gives no shape.
Result<WeightManifest> hybrid_manifest(const ModelConfig& cfg, HybridFamily family, const WeightLoader* checkpoint);

// `weights` is prefixed with the config's weight prefix (e.g. "model.").
Result<std::unique_ptr<Model>> load_qwen3_next_family(const ModelConfig& cfg, const WeightLoader& weights,
                                                      ThreadPool& pool, HybridFamily family);

// Registry entry points (model/families.h's ModelLoadFn).
Result<std::unique_ptr<Model>> load_qwen3_next(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);
Result<std::unique_ptr<Model>> load_qwen3_5(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);      // qwen3_5_text
Result<std::unique_ptr<Model>> load_qwen3_5_moe(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);  // qwen3_5_moe_text

}  // namespace strata
