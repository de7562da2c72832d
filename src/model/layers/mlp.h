// Gated feed-forward: down(act(gate(x)) * up(x)), act = SiLU (Llama, Qwen) or GELU-tanh (Gemma).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/weight.h"
#include "core/thread_pool.h"

namespace strata {

struct LinearLora;  // model/lora.h: adapters of the layer's linears (null: none)

struct GatedMlpWeights {
  WeightMatrix gate, up;  // [intermediate, hidden]
  WeightMatrix down;      // [hidden, intermediate]
  std::vector<float> gate_bias, up_bias, down_bias;  // empty: none
  int64_t intermediate() const { return gate.rows; }
};

struct MlpScratch {
  std::vector<float> gate, up;
};

// out [n, hidden] = mlp(x [n, hidden]); out must not alias x.
void gated_mlp_forward(ThreadPool& pool, const GatedMlpWeights& w, cpu::Activation act, const float* x, int64_t n,
                       MlpScratch& s, float* out, const LinearLora* lora = nullptr);

}  // namespace strata
