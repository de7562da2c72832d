// Gemma4TextConfig: the gemma4_text keys ModelConfig does not carry (per-layer attention
// geometry, per-layer input embeddings, KV sharing, the MoE block), resolved into one plain
// struct per layer so the forward pass never looks at JSON.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/model_config.h"
#include "model/weight_manifest.h"

namespace strata {

struct Gemma4LayerGeometry {
  bool sliding = false;    // sliding_attention (else full_attention)
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;    // q, k and v head dim of this layer
  bool k_eq_v = false;     // values are the raw key projection (attention_k_eq_v, full layers only)
  int32_t kv_source = -1;  // >= 0: reads that earlier layer's KV and computes none of its own
};

struct Gemma4TextConfig {
  int32_t ple_dim = 0;              // hidden_size_per_layer_input; 0: no per-layer inputs
  int32_t ple_vocab = 0;            // vocab_size_per_layer_input
  int32_t n_kv_shared_layers = 0;   // the last this many layers share KV
  bool double_wide_mlp = false;     // KV-shared layers' MLP is 2 x intermediate_size
  bool moe = false;                 // enable_moe_block: routed experts beside the dense MLP
  int32_t top_k = 0;                // top_k_experts
  std::vector<Gemma4LayerGeometry> layers;  // [n_layers]
};

// Reads cfg.text_json (the text model's config object). Errors name the key and the value.
Result<Gemma4TextConfig> parse_gemma4_text_config(const ModelConfig& cfg);

// Every tensor of a Gemma 4 text checkpoint (names under cfg.weight_prefix; the LM head under
// cfg.lm_head_name, tied when that is empty). Per layer: q (k, v and k_norm only on layers
// that own their KV; no v where attention_k_eq_v: the values are the key projection), o, the
// four norms, the dense MLP (twice as wide on KV-shared layers with use_double_wide_mlp), the
// MoE block (router, its scales, the fused experts and their norms), the per-layer input
// tensors, and the optional layer_scalar. kInvalidArgument names a config field whose value
// gives no valid shape.
Result<WeightManifest> gemma4_manifest(const ModelConfig& cfg, const Gemma4TextConfig& g4);

}  // namespace strata
