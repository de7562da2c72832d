// ModelConfig: what strata reads from a Hugging Face config.json (and generation_config.json),
// normalized across the key spellings of transformers 4 and 5 and of multimodal wrappers.
//
// Keys common to many families are parsed here into typed fields; a family that needs more
// reads them from `text_json` (the text model's own config object, after unwrapping).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "model/quant_config.h"

namespace strata {

struct RopeConfig {
  std::string type = "default";  // default, linear, dynamic, yarn, llama3, proportional
  double theta = 10000.0;
  double factor = 1.0;
  double partial_rotary_factor = 1.0;
  int64_t original_max_position = 0;  // 0: not given
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0, beta_slow = 1.0;               // yarn
  double attention_factor = 0.0;                          // yarn mscale (0: derive)
  double mscale = 0.0, mscale_all_dim = 0.0;              // yarn (0: not given)
  bool truncate = true;                                   // yarn: floor/ceil the correction range
};

struct ModelConfig {
  std::string model_type;        // text model's type after unwrapping (e.g. gemma3_text)
  std::string wrapper_type;      // outer model_type of a multimodal wrapper, else empty
  std::string weight_prefix;     // e.g. "model." or "model.language_model." (set at load from the tensor names)
  std::string lm_head_name;      // e.g. "lm_head.weight"; empty: tied to the embedding (set at load)
  int32_t vocab_size = 0;
  int32_t hidden = 0;            // hidden_size
  int32_t n_layers = 0;
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t intermediate = 0;
  int32_t max_position = 0;      // max_position_embeddings
  float rms_eps = 1e-6f;
  bool tie_embeddings = false;
  std::string dtype;             // checkpoint dtype as declared
  std::string hidden_act = "silu";
  bool attention_bias = false;
  bool mlp_bias = false;
  RopeConfig rope;               // for layers without a per-type override
  std::map<std::string, RopeConfig> rope_by_layer_type;  // per layer type (transformers 5 nested rope_parameters)
  std::vector<std::string> layer_types;  // per layer: full_attention, sliding_attention, linear_attention
  int32_t sliding_window = 0;
  // Gemma-style
  float attn_softcap = 0.0f;     // attn_logit_softcapping, 0: none
  float final_softcap = 0.0f;    // final_logit_softcapping, 0: none
  float query_pre_attn_scalar = 0.0f;  // 0: not given (scale by head_dim)
  // Mixture of experts
  int32_t n_experts = 0;         // num_experts or num_local_experts
  int32_t n_experts_per_tok = 0;
  int32_t moe_intermediate = 0;
  int32_t shared_expert_intermediate = 0;
  bool norm_topk_prob = false;
  int32_t decoder_sparse_step = 1;
  std::vector<int32_t> mlp_only_layers;
  // generation_config.json
  std::vector<int32_t> eos_ids;
  int32_t bos_id = -1;
  int32_t pad_id = -1;
  float default_temperature = -1.0f, default_top_p = -1.0f, default_min_p = -1.0f;  // < 0: unset
  int32_t default_top_k = -1;
  float default_repetition_penalty = -1.0f;
  int32_t default_do_sample = -1;  // -1 unset, 0 false (greedy), 1 true
  // Quantized weights (quantization_config, or MLX's quantization); never null after parsing.
  std::shared_ptr<const QuantConfig> quant;
  // Pooling (embedding) models: forward writes each row's final-normed hidden state
  // [rows, hidden] in place of logits (the LM head is not applied). Set by LoadOptions.
  bool hidden_output = false;
  // The text model's config object as read (after unwrapping a multimodal wrapper).
  std::shared_ptr<const nlohmann::json> text_json;

  // RoPE of a layer type: its override when the config has one, else `rope`.
  const RopeConfig& rope_for(const std::string& layer_type) const;
  // Floats per output row of Model::forward: the vocabulary, or hidden_output's hidden size.
  int32_t output_width() const { return hidden_output ? hidden : vocab_size; }
  bool is_sliding(int layer) const { return layer < int(layer_types.size()) && layer_types[layer] == "sliding_attention"; }
};

// Parses a config.json object; `source` names the file in errors.
Result<ModelConfig> parse_model_config(const nlohmann::json& config, const std::string& source);
// Reads generation_config.json keys (eos ids (int or list), bos, pad, sampling defaults).
Status apply_generation_config(const nlohmann::json& gen, const std::string& source, ModelConfig* cfg);
// `dir`/config.json plus `dir`/generation_config.json when present.
Result<ModelConfig> load_model_config(const std::string& dir);

}  // namespace strata
