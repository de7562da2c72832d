// Writes a Hugging Face checkpoint directory (config.json, generation_config.json,
// model.safetensors) with seeded random weights for a llama/qwen3-shaped model. Benchmarks and
// end-to-end tests generate their big models with it instead of downloading any.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "tensor/dtype.h"

namespace strata {

struct SyntheticModelSpec {
  std::string model_type = "qwen3";  // qwen3 (q/k norms) or llama
  int32_t vocab_size = 151936;
  int32_t hidden = 1024;
  int32_t n_layers = 28;
  int32_t n_heads = 16;
  int32_t n_kv_heads = 8;
  int32_t head_dim = 128;
  int32_t intermediate = 3072;
  int32_t max_position = 40960;
  double rope_theta = 1000000.0;
  bool tie_embeddings = true;
  DType dtype = DType::kBF16;  // kBF16 or kF32
  float init_std = 0.02f;
  uint64_t seed = 1;
  int32_t bos_id = 1;
  int32_t eos_id = 2;
};

// The shape of Qwen3-0.6B (28 layers, hidden 1024, 16/8 heads of 128, FFN 3072, vocab 151936, tied).
SyntheticModelSpec qwen3_0_6b_spec();

// Number of parameters the spec describes (embedding counted once when tied).
int64_t synthetic_param_count(const SyntheticModelSpec& spec);

// Writes the checkpoint into `dir` (created if missing).
Status write_synthetic_checkpoint(const std::string& dir, const SyntheticModelSpec& spec);

}  // namespace strata
