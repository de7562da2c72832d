// Model shapes the CUDA benchmarks run with random weights.
#pragma once

#include "model/model_config.h"

namespace strata::cuda::bench {

// Llama-3.1-8B: 32 layers, 4096 hidden, 14336 FFN, 32/8 heads of 128, vocab 128256, untied
// head, llama3 RoPE scaling.
inline ModelConfig llama8b() {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 128256;
  c.hidden = 4096;
  c.n_layers = 32;
  c.n_heads = 32;
  c.n_kv_heads = 8;
  c.head_dim = 128;
  c.intermediate = 14336;
  c.max_position = 131072;
  c.rms_eps = 1e-5f;
  c.tie_embeddings = false;
  c.rope.type = "llama3";
  c.rope.theta = 500000.0;
  c.rope.factor = 8.0;
  c.rope.low_freq_factor = 1.0;
  c.rope.high_freq_factor = 4.0;
  c.rope.original_max_position = 8192;
  return c;
}

}  // namespace strata::cuda::bench
