// The gated-DeltaNet hybrids on the GPU (qwen3_next, qwen3_5_text, qwen3_5_moe_text): the part
// of CudaDecoder that model/qwen3_next.h describes on the CPU (the spec; its config parsing and
// DeltaNetDims are reused). Internal to backend/cuda: cuda_hybrid.cpp holds the loader, the
// step and the state slots; cuda_model.* call into it through small hooks.
//
// Layers (x the f32 residual stream; norms (1 + w) but the DeltaNet output norm):
//   h = input_norm(x)
//   linear attention: p = in_proj(h) (rows q | k | v | z | b | a); c = silu(conv1d(p[q|k|v]))
//     with the slot's conv tail; q, k l2-normed; g, beta from a, b; o = delta rule (slot state);
//     branch = out_proj(rms_norm(o) * w * silu(z))
//   full attention: q, k, v, gate = h W; q, k (1 + w) head norms, partial RoPE; paged KV;
//     branch = o_proj(attention * sigmoid(gate))
//   x += branch; h = post_attention_norm(x)
//   FFN: dense gated MLP, or routed experts + sigmoid(h . shared_gate) * shared_expert(h)
//   x += FFN
//
// KV: the pool holds the full-attention layers only (Layer::kv_layer indexes it), as the
// engine's layout has no KV for the linear layers. With KV codecs those rows are codec rows and
// the attention layers run through KvCodecStep (its pool layer p: the p-th attention layer, the
// turbo rotation seeded by the model layer, as on the CPU). State: per linear layer a conv pool
// [n_slots + 1, kernel - 1, conv_dim] and a recurrent pool [n_slots + 1, n_v_heads, d_k, d_v]
// (f32); slot n_slots is scratch for spans without tokens. save_state / load_state move one
// slot in the engine's layout: per linear layer the conv floats, then the recurrent ones.
//
// Split weights (weight_split.h, f32 / f16 checkpoints): every matrix goes up as a bf16 hi + lo
// pair; the GEMM inputs carry their lo parts too (norm outputs, the gated activations, and here
// the DeltaNet's gated-norm output and the gated attention output), the routed experts read
// hi + lo, the shared expert's gate reads h + h_lo.
//
// The delta rule takes its form per absolute block of 64 positions as backend/cpu/delta_net.h
// chooses it: the rows of a span from a block's start on run chunked when they cover the rest of
// the span in whole blocks, or its tail when that has 16 rows or more; a piece that starts
// mid-block or a short tail runs the recurrent form (decode). Each form is one launch over
// lists padded to the step's sequence count, so a decode step of a given batch size launches
// the same grids every time (CUDA graphs).
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "model/delta_net.h"
#include "model/kv_storage.h"
#include "model/model_config.h"
#include "runtime/cuda/cuda_model.h"

namespace strata::cuda {

// Whether model_type is one of the hybrid families.
bool is_hybrid_type(const std::string& model_type);

struct CudaDecoder::Hybrid {
  struct HLayer {
    bool linear = false;
    int32_t state = -1;             // index of the linear layer's state pools
    // Linear attention.
    uint16_t* in_proj = nullptr;    // [P, hidden]: q | k | v | z | b | a rows
    float* conv_w = nullptr;        // [conv_dim, kernel]
    float* a_log = nullptr;         // [n_v_heads]
    float* dt_bias = nullptr;       // [n_v_heads]
    float* norm_w = nullptr;        // [d_v]
    uint16_t* out_proj = nullptr;   // [hidden, value_dim]
    // Full attention (Layer::qkv holds the query halves of q_proj, then k, v).
    uint16_t* gate = nullptr;       // [n_heads head_dim, hidden] the gate halves of q_proj
    // Shared expert of sparse layers.
    uint16_t* shared_gate_up = nullptr;  // [2 shared_inter, hidden]
    uint16_t* shared_down = nullptr;     // [hidden, shared_inter]
    float* shared_gate = nullptr;        // [hidden]
  };
  DeltaNetDims dn;
  int64_t proj_rows = 0;       // P = 2 key_dim + 2 value_dim + 2 n_v_heads
  int64_t shared_inter = 0;
  bool renormalize = false;    // top-k weights divided by their sum
  std::vector<HLayer> layers;
  int32_t n_attn_layers = 0;

  // State pools per linear layer, n_slots + 1 slots each.
  int32_t n_slots = 0;
  std::vector<float*> conv, rec;
  float** pools_dev = nullptr;     // [2 n_linear]: conv pools then recurrent pools
  int64_t* floats_dev = nullptr;   // [2 n_linear] floats per slot of each

  // Step scratch, T = max_tokens.
  float* proj = nullptr;       // [T, P]
  float* mixed = nullptr;      // [T, conv_dim]
  float* g = nullptr;          // [T, n_v_heads]
  float* beta = nullptr;       // [T, n_v_heads]
  float* core = nullptr;       // [T, value_dim]
  uint16_t* core_h = nullptr;  // [T, value_dim] bf16
  float* gate_f = nullptr;     // [T, n_heads head_dim]
  float* shared_out = nullptr; // [T, hidden]
  // Split weights with sparse layers, K = T * top_k: the experts' gate/up rows in f32 and the lo
  // part of their activation (the down GEMM reads hi + lo).
  float* moe_gu_f = nullptr;         // [K, 2 moe_inter]
  uint16_t* moe_act_lo = nullptr;    // [K, moe_inter]

  // Step metadata, M = max_seqs ints per field: slot, reset, then three span lists (recurrent
  // heads, chunked middles, recurrent tails) of start, end, slot, pos0 each.
  int32_t* meta_host = nullptr;  // pinned
  int32_t* meta_dev = nullptr;
  int64_t meta_ints = 0;
  cudaEvent_t meta_copied = nullptr;
  bool meta_pending = false;
  int32_t n_seqs = 0, max_rows = 0;  // of the step being enqueued
  bool any_chunked = false;

  static constexpr int32_t kSlot = 0, kReset = 1, kLists = 2;  // field index, times M
  ~Hybrid();
};

// Tokens a step of the engine may hold past its max_batch_tokens for this model: the
// scheduler's first prefill piece of a step takes a whole 64-position block when less budget
// is left (engine/scheduler.cpp), so a hybrid's step exceeds the budget by less than a block.
int32_t step_token_slack(const ModelConfig& cfg);

// Bytes of the arena a hybrid model of cfg (layer_types resolved) needs.
Result<size_t> hybrid_arena_bytes(const ModelConfig& cfg, const CudaModelOptions& options);

}  // namespace strata::cuda
