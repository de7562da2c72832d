// Attention over the paged KV cache for a packed StepBatch: projections (+ bias), optional
// per-head q/k RMSNorm, RoPE per span, K/V appended through each span's block table, then
// cpu::paged_attention per span and the output projection.
//
// The pieces (project, write_kv, attend) are separate so families with unusual attention
// (shared KV, value norms, gated outputs) can compose their own block from them.
#pragma once

#include <cstdint>
#include <vector>

#include "backend/weight.h"
#include "core/thread_pool.h"
#include "model/kv_storage.h"
#include "model/rope.h"
#include "model/step_batch.h"

namespace strata {

struct LinearLora;  // model/lora.h: adapters of the layer's linears (null: none)

struct AttentionWeights {
  WeightMatrix q, k, v, o;          // q [n_heads*head_dim, hidden], k/v [n_kv_heads*head_dim(_v), hidden], o [hidden, n_heads*head_dim_v]
  std::vector<float> q_bias, k_bias, v_bias, o_bias;  // empty: none
  std::vector<float> q_norm, k_norm;                  // [head_dim] per-head RMSNorm weights; empty: none
};

struct AttentionParams {
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t head_dim_v = 0;
  float scale = 1.0f;             // multiplies q·k
  float softcap = 0.0f;           // 0: none
  int32_t window = 0;             // 0: full causal; else sliding window in tokens
  float norm_eps = 1e-6f;         // q/k norm epsilon
  bool norm_one_plus_w = false;   // q/k norm weight used as (1 + w)
  RopeProvider* rope = nullptr;   // nullptr: no rotary embedding
};

// Reusable buffers (grown on demand, kept across steps).
struct AttentionScratch {
  std::vector<float> q, k, v, attn;
};

// Positions of every token of the batch: span s's token i sits at pos0 + i.
void batch_positions(const StepBatch& batch, std::vector<int32_t>* positions /*[n_tokens]*/);

// Applies RoPE to x [n_tokens, n_heads, head_dim] span by span (dynamic RoPE depends on the
// span's length).
void apply_rope(ThreadPool& pool, RopeProvider& rope, const StepBatch& batch, const int32_t* positions, float* x,
                int32_t n_heads, int32_t head_dim);

// Appends k [n_tokens, n_kv_heads, head_dim] and v [n_tokens, n_kv_heads, head_dim_v] of every
// span at its positions into `layer`'s pools.
// Layers stored in a codec other than f32 are encoded row by row (over the pool); the
// overload without a pool takes f32 layers only.
void write_kv(ThreadPool& pool, const StepBatch& batch, KvStorage& kv, int layer, const float* k, const float* v);
void write_kv(const StepBatch& batch, KvStorage& kv, int layer, const float* k, const float* v);

// out [n_tokens, n_heads, head_dim_v] = attention of q [n_tokens, n_heads, head_dim] over
// `layer`'s cache (which must already hold every span's new K/V), read in the layer's codec.
void attend(ThreadPool& pool, const StepBatch& batch, KvStorage& kv, int layer, const AttentionParams& p, const float* q,
            float* out);

// The whole block: x [n_tokens, hidden] -> out [n_tokens, hidden].
void attention_forward(ThreadPool& pool, const AttentionWeights& w, const AttentionParams& p, const StepBatch& batch,
                       const int32_t* positions, const float* x, KvStorage& kv, int layer, AttentionScratch& s,
                       float* out, const LinearLora* lora = nullptr);

}  // namespace strata
