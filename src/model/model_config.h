// ModelConfig: what strata reads from a Hugging Face config.json (and generation_config.json),
// normalized across the key spellings of transformers 4 and 5 and of multimodal wrappers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace strata {

struct RopeConfig {
  std::string type = "default";  // default, linear, dynamic, yarn, llama3, proportional
  double theta = 10000.0;
  double factor = 1.0;
  double partial_rotary_factor = 1.0;
  int64_t original_max_position = 0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;  // llama3
  double beta_fast = 32.0, beta_slow = 1.0;               // yarn
  double attention_factor = 0.0;                          // yarn mscale (0: derive)
};

struct ModelConfig {
  std::string model_type;        // text model's type after unwrapping (e.g. gemma3_text)
  std::string wrapper_type;      // outer model_type of a multimodal wrapper, else empty
  std::string weight_prefix;     // e.g. "model." or "model.language_model."
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
  RopeConfig rope;               // for layers without a per-type override
  std::vector<std::string> layer_types;  // per layer: full_attention, sliding_attention, linear_attention
  int32_t sliding_window = 0;
  // generation_config.json
  std::vector<int32_t> eos_ids;
  int32_t bos_id = -1;
  int32_t pad_id = -1;
  float default_temperature = -1.0f, default_top_p = -1.0f, default_min_p = -1.0f;  // < 0: unset
  int32_t default_top_k = -1;
  float default_repetition_penalty = -1.0f;
};

}  // namespace strata
