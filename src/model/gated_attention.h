// GatedAttentionLayer: the full-attention layer of the Qwen3-Next / Qwen3.5 hybrids.
//
// Standard GQA over the paged KV cache (layers/attention.h pieces) with three differences:
// q_proj yields per head [query (head_dim) | gate (head_dim)]; q and k get a per-head
// (1 + w) RMSNorm; the attention output is multiplied by sigmoid(gate) before o_proj.
// Partial rotary (rot_dim < head_dim) comes from the RoPE table.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/kv_storage.h"
#include "model/layers/attention.h"
#include "model/step_batch.h"

namespace strata {

class WeightLoader;
struct WeightManifest;

struct GatedAttentionScratch {
  AttentionScratch attn;
  std::vector<float> gate;  // [n_tokens, n_heads * head_dim]
};

class GatedAttentionLayer {
 public:
  // Layer `layer`'s tensors as `m` names them (biases when it lists them); `w` is prefixed
  // with the weight prefix.
  static Result<GatedAttentionLayer> load(const WeightLoader& w, const WeightManifest& m, int32_t layer, int32_t hidden,
                                          int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, float eps);

  KvLayerSpec kv_spec() const;

  // x [n_tokens, hidden] (input-normed) -> out [n_tokens, hidden]; appends the batch's K/V.
  void forward(ThreadPool& pool, RopeProvider& rope, const StepBatch& batch, const int32_t* positions, const float* x,
               KvStorage& kv, int layer, GatedAttentionScratch& s, float* out) const;

 private:
  AttentionWeights w_;   // q [n_heads*head_dim, hidden] (query rows only), k, v, o; q/k norms
  WeightMatrix gate_;    // [n_heads*head_dim, hidden] the gate rows of q_proj
  std::vector<float> gate_bias_;  // empty: none
  AttentionParams p_;
};

}  // namespace strata
