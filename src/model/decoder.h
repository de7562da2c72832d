// DecoderModel: the pre-norm decoder-only transformer most families are variations of
// (Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Gemma 2, Gemma 3). A family file turns its
// config into a DecoderSpec and calls load_decoder; the differences are all flags here.
//
// Layer (plain):    h = x + attn(norm_in(x));  x' = h + ffn(norm_post_attn(h))
// Layer (sandwich): h = x + norm_post_attn(attn(norm_in(x)));
//                   x' = h + norm_post_ffn(ffn(norm_pre_ffn(h)))
// Tensor names are Hugging Face's under the config's weight prefix:
//   embed_tokens.weight, layers.{i}.input_layernorm.weight, layers.{i}.self_attn.{q,k,v,o}_proj.weight
//   (+ .bias), layers.{i}.self_attn.{q,k}_norm.weight, layers.{i}.post_attention_layernorm.weight,
//   layers.{i}.pre_feedforward_layernorm.weight, layers.{i}.post_feedforward_layernorm.weight,
//   layers.{i}.mlp.{gate,up,down}_proj.weight, layers.{i}.mlp.gate.weight,
//   layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight, norm.weight; lm_head per the config.
#pragma once

#include <memory>

#include "backend/cpu/cpu_ops.h"
#include "model/model.h"
#include "model/weight_loader.h"

namespace strata {

struct DecoderSpec {
  bool norm_one_plus_w = false;  // Gemma: RMSNorm scales by (1 + w)
  bool sandwich_norms = false;   // Gemma 2/3: norms on the attention and MLP outputs too
  bool qk_norm = false;          // Qwen3, Gemma 3: per-head RMSNorm of q and k before RoPE
  bool qkv_bias = false;         // Qwen2 (and attention_bias configs)
  bool o_bias = false;
  bool mlp_bias = false;
  bool moe = false;              // Qwen3-MoE: sparse layers per decoder_sparse_step / mlp_only_layers
  float embed_scale = 1.0f;      // Gemma: sqrt(hidden) in the compute dtype
  cpu::Activation act = cpu::Activation::kSilu;
  float attn_scale = 0.0f;       // 0: head_dim^-0.5
  float attn_softcap = 0.0f;     // 0: none
  float final_softcap = 0.0f;    // 0: none
};

// Loads weights named as above and returns the model. Shape mismatches name the tensor.
Result<std::unique_ptr<Model>> load_decoder(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool,
                                            const DecoderSpec& spec);

// Maps hidden_act / hidden_activation to a kernel activation.
Result<cpu::Activation> activation_from_name(const std::string& name);

// Each DecoderSpec family's settings for its config (the family files), registered beside its
// loader (registry.h, family_decoder_spec). Gemma 2: (1 + w) and sandwich norms, embedding
// scale, query_pre_attn_scalar, soft-caps; Gemma 3 adds q/k norms on top.
Result<DecoderSpec> llama_decoder_spec(const ModelConfig& cfg);  // llama, mistral
Result<DecoderSpec> qwen2_decoder_spec(const ModelConfig& cfg);
Result<DecoderSpec> qwen3_decoder_spec(const ModelConfig& cfg);
Result<DecoderSpec> qwen3_moe_decoder_spec(const ModelConfig& cfg);
Result<DecoderSpec> gemma2_decoder_spec(const ModelConfig& cfg);
Result<DecoderSpec> gemma3_decoder_spec(const ModelConfig& cfg);

}  // namespace strata
