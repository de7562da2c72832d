// Which decoder families CudaDecoder computes and what each changes in the plain layer: the
// settings of the family's DecoderSpec (model/decoder.h) that the CUDA forward implements,
// derived from the shared ModelConfig (no config parsing of its own); for the shared decoder's
// families, from the family's own DecoderSpec (flags_of).
#pragma once

#include <cstdint>

#include "core/status.h"
#include "model/model_config.h"

namespace strata {
struct DecoderSpec;
}  // namespace strata

namespace strata::cuda {

struct FamilyFlags {
  bool qk_norm = false, qkv_bias = false, o_bias = false;
  bool one_plus_w = false;  // RMSNorm scales by (1 + w)
  bool sandwich = false;    // norms on the attention and FFN outputs too (Gemma 2/3)
  bool moe = false;         // sparse layers per layer_sparse
  bool gemma4 = false;      // Gemma 4's layer (CudaDecoder::launch_gemma4_step); moe: its MoE block
  bool hybrid = false;      // gated-DeltaNet hybrid (cuda_hybrid.h); moe: routed + shared experts
  float embed_scale = 1.0f;
  float attn_scale = 0.0f;  // 0: head_dim^-0.5
  float attn_softcap = 0.0f, final_softcap = 0.0f;
};

// The flags of a DecoderSpec family (its spec from the family file, registry.h).
FamilyFlags flags_of(const DecoderSpec& spec);

// The flags of cfg's family, or kUnsupported naming the model_type (kInvalidArgument for a
// MoE config without experts or with a bad top-k).
Result<FamilyFlags> family_flags(const ModelConfig& cfg);

// Whether layer l routes to experts: the rule of load_decoder (model/decoder.cpp) for the
// families that set DecoderSpec::moe.
bool layer_sparse(const ModelConfig& cfg, int64_t l);

}  // namespace strata::cuda
