// WeightManifest: every tensor a family reads, described once in src/model: its checkpoint
// name, what it is for (its role, layer and expert), its shape, the fused groups a backend
// may pack it into, and what a dummy (random-weights) model holds in it. A backend's loader
// walks the manifest (the CPU packs each entry, the GPU uploads fused groups into its arena,
// --load-format dummy draws every entry from its init) and never spells a tensor name; formats
// (quantized weights) and adapters plug in here, once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/model_config.h"

namespace strata {

struct DecoderSpec;

enum class WeightRole : uint8_t {
  kEmbed,        // [vocab, hidden]
  kLmHead,       // [vocab, hidden]; absent when tied to kEmbed
  kFinalNorm,    // [hidden]
  kInputNorm,    // [hidden] before attention
  kPostAttnNorm, // [hidden] after attention: the FFN's input norm (plain) or the attention output's (sandwich)
  kPreFfnNorm,   // [hidden] sandwich: the FFN's input norm
  kPostFfnNorm,  // [hidden] sandwich: the FFN output's norm
  kQ, kK, kV,    // [heads * head_dim, hidden]
  kO,            // [hidden, heads * head_dim]
  kQBias, kKBias, kVBias, kOBias,
  kQNorm, kKNorm,           // [head_dim] per-head RMSNorm before RoPE
  kGate, kUp,               // [intermediate, hidden] dense gated MLP
  kDown,                    // [hidden, intermediate]
  kGateBias, kUpBias, kDownBias,
  kRouter,                  // [experts, hidden]
  kExpertGate, kExpertUp,   // [moe_intermediate, hidden] of expert `expert`
  kExpertDown,              // [hidden, moe_intermediate]
  kFusedExpertsGateUp,      // [experts, 2 * moe_intermediate, hidden]: every expert's gate then up rows, one tensor
  kFusedExpertsDown,        // [experts, hidden, moe_intermediate], one tensor
  // Gemma 4.
  kRouterScale,             // [hidden] multiplies the router's normed input
  kExpertScale,             // [experts] multiplies each expert's output
  kMoePostMlpNorm,          // [hidden] the dense MLP output's norm when the MoE block sits beside it
  kMoePreNorm,              // [hidden] the MoE block's input norm
  kMoePostNorm,             // [hidden] the MoE block output's norm
  kPleEmbed,                // [ple_vocab, layers * ple_dim] per-layer input embeddings
  kPleModelProj,            // [layers * ple_dim, hidden]
  kPleProjNorm,             // [ple_dim]
  kPleGate,                 // [ple_dim, hidden] of a layer
  kPleProj,                 // [hidden, ple_dim]
  kPleNorm,                 // [hidden]
  kLayerScalar,             // [1] multiplies the layer's output
  // The gated-DeltaNet hybrids (model/qwen3_next.h): their linear-attention layers ...
  kDeltaQkvz,               // [n_k * (2 d_k + 2 r d_v), hidden] fused, rows grouped per key head (r = n_v / n_k)
  kDeltaBa,                 // [2 n_v, hidden] fused, [b_g (r) | a_g (r)] per key head
  kDeltaQkv,                // [2 key_dim + value_dim, hidden] split form: q | k | v
  kDeltaZ,                  // [value_dim, hidden] the output gate
  kDeltaB,                  // [n_v, hidden] write strength
  kDeltaA,                  // [n_v, hidden] decay input
  kDeltaConv,               // [conv_dim, 1, conv_kernel] depthwise causal conv over q | k | v
  kDeltaConvBias,           // [conv_dim]; no loader takes one: listed so a checkpoint holding it is refused
  kDeltaALog,               // [n_v] log of the decay rate
  kDeltaDtBias,             // [n_v]
  kDeltaNorm,               // [d_v] gated RMSNorm, plain w
  kDeltaOut,                // [hidden, value_dim]
  // ... their gated full-attention layers ...
  kQGate,                   // [2 * heads * head_dim, hidden]: per head [query (head_dim) | gate (head_dim)] rows
  kQGateBias,               // [2 * heads * head_dim] in the same layout
  // ... and their shared expert.
  kSharedGate, kSharedUp,   // [shared_intermediate, hidden]
  kSharedDown,              // [hidden, shared_intermediate]
  kSharedExpertGate,        // [1, hidden] sigmoid(x . w) scales the shared expert's output
};

// Entries a backend may concatenate by rows, in manifest order, into one tensor per layer.
enum class WeightFuse : uint8_t {
  kNone,
  kQkv,            // q, k, v
  kQkvBias,        // their biases
  kGateUp,         // gate, up
  kExpertsGateUp,  // every expert's gate then up, expert by expert
  kExpertsDown,    // every expert's down, expert by expert
  kDeltaInProj,    // DeltaNet q | k | v | z | b | a (the grouped kDeltaQkvz / kDeltaBa form regrouped by kind)
  kSharedGateUp,   // the shared expert's gate, up
};

// What a dummy model holds: uniform random values at the backend's scale, a constant, or
// uniform values in [value, value_hi] (parameters whose range the forward depends on: a decay's
// log, a conv kernel).
enum class WeightInit : uint8_t { kRandom, kConstant, kUniform };

struct WeightEntry {
  std::string name;        // the checkpoint tensor, under the config's weight prefix unless `absolute`
  bool absolute = false;   // the name is the whole tensor name (lm_head.weight beside model.*)
  WeightRole role = WeightRole::kEmbed;
  int32_t layer = -1;      // -1: not in a layer
  int32_t expert = -1;     // -1: not an expert's
  std::vector<int64_t> shape;  // [rows, cols] of a matrix (rows = outputs), [n] of a vector,
                               // [experts, rows, cols] of a fused experts tensor
  WeightFuse fuse = WeightFuse::kNone;
  WeightInit init = WeightInit::kRandom;
  bool optional = false;   // a checkpoint may lack it (a buffer added after it was written)
  float value = 0.0f;      // kConstant: the value (a norm's unit: 1, or 0 for (1 + w) norms); kUniform: the low end
  float value_hi = 0.0f;   // kUniform: the high end
  int64_t cols() const { return shape.back(); }
  int64_t rows() const { return numel() / cols(); }  // of the tensor read as a [rows, cols] matrix
  bool is_matrix() const { return shape.size() == 2; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct WeightManifest {
  std::vector<WeightEntry> entries;  // model-level entries first, then layer by layer
  bool tied_embeddings = false;      // the LM head reads kEmbed
  // The entries of `layer` (-1: the model-level ones), in manifest order.
  std::vector<const WeightEntry*> of_layer(int32_t layer) const;
  // The one entry with `role` in `layer` (and `expert`), or null.
  const WeightEntry* find(WeightRole role, int32_t layer = -1, int32_t expert = -1) const;
};

// The manifest of a DecoderSpec family (model/decoder.h) for `cfg`, whose weight_prefix and
// lm_head_name are resolved (resolve_weight_names) or, for a dummy model, left empty (the LM
// head is then tied exactly when the config ties it). kInvalidArgument names a config field
// whose value gives no valid shape.
Result<WeightManifest> decoder_manifest(const ModelConfig& cfg, const DecoderSpec& spec);

// Whether layer l of a DecoderSpec family with spec.moe routes to experts
// (decoder_sparse_step, mlp_only_layers).
bool decoder_layer_sparse(const ModelConfig& cfg, const DecoderSpec& spec, int64_t l);

}  // namespace strata
