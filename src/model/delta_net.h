// DeltaNetLayer: the gated-DeltaNet token mixer of the Qwen3-Next / Qwen3.5 hybrids.
//
// Per token: one projection gives q, k, v (through a causal depthwise conv1d with SiLU),
// the output gate z, and the per-value-head decay input a and write strength b. q and k are
// l2-normalized; the gated delta rule (backend/cpu/delta_net.h: the chunked form over prefill
// spans, the recurrent one over decode rows) mixes them into a per-head state; the output is
// rms_norm(o) * w * silu(z), projected back to the hidden size.
// A sequence's conv tail and state matrices live in its StateStorage slot, so prefill can be
// split into any chunks and decode runs one token at a time without recomputing anything.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/weight.h"
#include "core/status.h"
#include "core/thread_pool.h"
#include "model/kv_storage.h"
#include "model/model_config.h"

namespace strata {

class WeightLoader;
struct WeightManifest;

struct DeltaNetDims {
  int32_t n_k_heads = 0;    // linear_num_key_heads (q and k heads)
  int32_t n_v_heads = 0;    // linear_num_value_heads (a multiple of n_k_heads)
  int32_t d_k = 0;          // linear_key_head_dim
  int32_t d_v = 0;          // linear_value_head_dim
  int32_t conv_kernel = 0;  // linear_conv_kernel_dim

  int64_t key_dim() const { return int64_t(n_k_heads) * d_k; }
  int64_t value_dim() const { return int64_t(n_v_heads) * d_v; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }  // channels through the conv: q | k | v
  // Floats a sequence keeps per layer: the conv tail and the state matrices.
  StateLayerSpec state_spec() const;
};

// Reads linear_* keys from the config; errors name the key and the value.
Result<DeltaNetDims> parse_delta_net_dims(const ModelConfig& cfg, const std::string& source);

// One sequence's slice of a packed batch.
struct DeltaNetSpan {
  int64_t t0 = 0;            // first row of the sequence in the batch
  int32_t n_tokens = 0;
  int32_t pos0 = 0;          // absolute position of its first token
  float* conv = nullptr;     // [conv_kernel - 1, conv_dim] carried conv inputs (its state slot)
  float* recurrent = nullptr;  // [n_v_heads, d_k, d_v] carried state (its state slot)
};

// Step buffers of forward(), grown on demand and kept across steps (owned by the model).
struct DeltaNetScratch {
  std::vector<float> proj;   // [n_tokens, in_proj rows]
  std::vector<float> mixed;  // [n_tokens, conv_dim] conv output q | k | v
  std::vector<float> g, beta;  // [n_tokens, n_v_heads]
  std::vector<float> core;   // [n_tokens, value_dim]
};

class DeltaNetLayer {
 public:
  // Layer `layer`'s tensors as `m` names them (the fused grouped input projections of
  // qwen3_next or the split ones of qwen3_5); `w` is prefixed with the weight prefix.
  static Result<DeltaNetLayer> load(const WeightLoader& w, const WeightManifest& m, int32_t layer, const DeltaNetDims& dims,
                                    int32_t hidden, float eps);

  const DeltaNetDims& dims() const { return dims_; }

  // x [n_tokens, hidden] (already input-normed) -> out [n_tokens, hidden]; advances each
  // span's state. Spans cover disjoint rows; rows outside every span are left untouched.
  void forward(ThreadPool& pool, const float* x, int64_t n_tokens, const std::vector<DeltaNetSpan>& spans,
               DeltaNetScratch& scratch, float* out) const;

 private:
  DeltaNetDims dims_;
  int32_t hidden_ = 0;
  float eps_ = 1e-6f;
  WeightMatrix in_proj_;         // [2 key_dim + 2 value_dim + 2 n_v_heads, hidden]: rows q | k | v | z | b | a
  std::vector<float> conv_w_;    // [conv_dim, conv_kernel]
  std::vector<float> a_log_;     // [n_v_heads]
  std::vector<float> dt_bias_;   // [n_v_heads]
  std::vector<float> norm_w_;    // [d_v] gated RMSNorm weight (plain w, not 1 + w)
  WeightMatrix out_proj_;        // [hidden, value_dim]
};

}  // namespace strata
