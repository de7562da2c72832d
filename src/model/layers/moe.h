// Sparse mixture of experts (Qwen3-MoE style): router logits -> softmax (f32) -> top-k ->
// optional renormalization of the k weights -> sum of the chosen experts' gated MLPs, each
// token's terms added in ascending expert order (as transformers' expert loop does).
#pragma once

#include <cstdint>
#include <vector>

#include "model/layers/mlp.h"

namespace strata {

struct MoeWeights {
  WeightMatrix router;                  // [n_experts, hidden]
  std::vector<GatedMlpWeights> experts;  // [n_experts]
  int32_t top_k = 1;
  bool norm_topk_prob = false;
};

struct MoeScratch {
  std::vector<float> router_logits;  // [n, n_experts]
  std::vector<int32_t> topk_ids;     // [n, top_k]
  std::vector<float> topk_weights;   // [n, top_k]
  std::vector<float> xs, ys;         // gathered rows of one expert
  std::vector<int64_t> rows;         // token index per gathered row
  std::vector<int32_t> slot;         // which of the token's k choices per gathered row
  std::vector<float> contrib;        // [n, top_k, hidden] weighted expert outputs
  MlpScratch mlp;
};

// Softmax over logits [n, n_experts] per row, top-k (ties: lower id first), optional
// renormalization. ids/weights [n, k], each row sorted by descending weight.
void route_topk(const float* logits, int64_t n, int32_t n_experts, int32_t k, bool renormalize, int32_t* ids,
                float* weights);

// out [n, hidden] = moe(x [n, hidden]).
void moe_forward(ThreadPool& pool, const MoeWeights& w, cpu::Activation act, const float* x, int64_t n, int64_t hidden,
                 MoeScratch& s, float* out);

// The expert half of moe_forward for routing the caller decided (Gemma 4 routes from its own
// norm and scales): out [n, hidden] = sum over each token's k choices of
// weights[t, j] * experts[ids[t, j]](x[t]), summed in ascending expert id order.
// ids/weights [n, k]; k <= 64; out must not alias x.
void moe_experts_forward(ThreadPool& pool, const std::vector<GatedMlpWeights>& experts, cpu::Activation act,
                         const float* x, int64_t n, int64_t hidden, const int32_t* ids, const float* weights, int32_t k,
                         MoeScratch& s, float* out);

}  // namespace strata
