// The pieces of CudaDecoder that its families' loaders share (cuda_model.cpp, cuda_gemma4.cpp):
// the layer and buffer structs, the model dimensions, the arena sizing and scratch, uploads.
// Internal to backend/cuda.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/weight_split.h"


// Inside a loader returning a Result: reads a tensor (expr, a Result<std::vector<float>>) and
// uploads it into the arena `A` in scope with upload(A, values, what), assigning the device
// pointer to dst; the first error is returned from the loader.
#define STRATA_CUDA_LOAD(dst, expr, upload, what) \
  do {                                            \
    auto v_ = (expr);                             \
    if (!v_.ok()) return v_.error();              \
    auto p_ = upload(A, *v_, what);               \
    if (!p_.ok()) return p_.error();              \
    dst = *p_;                                    \
  } while (0)

namespace strata::cuda {
namespace model_parts {
inline constexpr int32_t kMaxSplits = 32;  // split-KV partial buffers hold this many splits
inline constexpr size_t kGemmWorkspace = size_t(32) << 20;
}  // namespace model_parts

struct CudaDecoder::Layer {
  uint16_t* qkv = nullptr;      // [(n_heads + 2 n_kv_heads) head_dim, hidden]
  uint16_t* o = nullptr;        // [hidden, n_heads head_dim]
  uint16_t* gate_up = nullptr;  // [2 inter, hidden]: gate rows then up rows
  uint16_t* down = nullptr;     // [hidden, inter]
  float* in_norm = nullptr;     // [hidden]
  float* post_norm = nullptr;   // [hidden] the FFN input norm (sandwich: pre_feedforward_layernorm)
  float* attn_out_norm = nullptr;  // [hidden] sandwich: post_attention_layernorm, else null
  float* ffn_out_norm = nullptr;   // [hidden] sandwich: post_feedforward_layernorm, else null
  // Sparse (MoE) layers instead of gate_up/down:
  uint16_t* router = nullptr;           // [n_experts, hidden]
  uint16_t* experts_gate_up = nullptr;  // [n_experts, 2 moe_inter, hidden]: gate rows then up rows
  uint16_t* experts_down = nullptr;     // [n_experts, hidden, moe_inter]
  float* qkv_bias = nullptr;    // [(n_heads + 2 n_kv_heads) head_dim] or null
  float* o_bias = nullptr;      // [hidden] or null
  float* q_norm = nullptr;      // [head_dim] or null
  float* k_norm = nullptr;      // [head_dim] or null
  int32_t rope = 0;             // index into Buffers::rope_*
  int32_t window = 0;
  // Gemma 4 (cuda_gemma4.cpp): this layer's own geometry (qkv is [(n_heads + 2 n_kv_heads)
  // head_dim, hidden], or only the q rows when the layer reads another layer's KV), MLP width,
  // and the KV pool layer it reads (its own, or the earlier layer whose KV it shares).
  int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t inter = 0;
  int32_t kv_layer = -1;
  bool own_kv = true;
  float layer_scalar = 1.0f;
  uint16_t* ple_gate = nullptr;  // [ple_dim, hidden] per_layer_input_gate
  uint16_t* ple_proj = nullptr;  // [hidden, ple_dim] per_layer_projection
  float* ple_norm = nullptr;     // [hidden] post_per_layer_input_norm
  // Gemma 4 MoE block beside the dense MLP (router, experts_gate_up and experts_down above).
  float* router_scale = nullptr;      // [hidden] router.scale * hidden^-0.5
  float* per_expert_scale = nullptr;  // [n_experts]
  float* moe_mlp_norm = nullptr;      // [hidden] post_feedforward_layernorm_1 (dense MLP output)
  float* moe_pre_norm = nullptr;      // [hidden] pre_feedforward_layernorm_2 (experts' input)
  float* moe_out_norm = nullptr;      // [hidden] post_feedforward_layernorm_2 (experts' output)
};

struct CudaDecoder::Buffers {
  std::unique_ptr<WeightSplit> split;  // the lo parts of a split checkpoint (weight_split.h), or null
  uint16_t* embed = nullptr;     // [vocab, hidden]
  uint16_t* lm_head = nullptr;   // [vocab, hidden] (== embed when tied)
  float* final_norm = nullptr;   // [hidden]
  std::vector<float*> rope_inv_freq;  // per distinct layer type: [rot_dim / 2]
  std::vector<int32_t> rope_rot_dim;
  std::vector<float> rope_attn_factor;

  float* x = nullptr;            // [T, hidden] residual stream
  uint16_t* h = nullptr;         // [T, hidden] normalized
  float* qkv = nullptr;          // [T, qkv_rows]
  uint16_t* q = nullptr;         // [T, n_heads head_dim]
  uint16_t* attn = nullptr;      // [T, n_heads head_dim]
  float* branch = nullptr;       // [T, hidden]
  uint16_t* gate_up = nullptr;   // [T, 2 inter]
  uint16_t* act = nullptr;       // [T, inter]
  uint16_t* rows_h = nullptr;    // [R, hidden]
  float* logits = nullptr;       // [R, vocab]
  int32_t* argmax = nullptr;     // [R]
  float* partial_out = nullptr;  // [kMaxSplits, S, n_heads, head_dim]
  float* partial_ml = nullptr;   // [kMaxSplits, S, n_heads, 2]
  // Fused decode (launch_step): the norm inputs passed between GEMVs as partial sums of squares.
  float* ss_embed = nullptr;       // [kGemvMaxRows] sum of squares of each embedded row
  float* ss_parts = nullptr;       // [kGemvMaxRows, gemv_blocks(hidden)] per-block sums of squares
  int32_t* split_counters = nullptr;  // [S, n_kv_heads] zeros between steps (attention's in-kernel combine)
  // MoE layers (moe.h), when the model has any: K = T * top_k routed slots.
  float* moe_logits = nullptr;      // [T, n_experts]
  int32_t* moe_ids = nullptr;       // [T, top_k]
  float* moe_w = nullptr;           // [T, top_k]
  int32_t* moe_offsets = nullptr;   // [n_experts + 1]
  int32_t* moe_sorted = nullptr;    // [K]
  int32_t* moe_slot_row = nullptr;  // [K]
  uint16_t* moe_gate_up = nullptr;  // [K, 2 moe_inter]
  uint16_t* moe_act = nullptr;      // [K, moe_inter]
  float* moe_y = nullptr;           // [K, hidden]
  // Gemma 4 (cuda_gemma4.cpp), D = ple_dim, L layers: per-layer input weights and scratch.
  uint16_t* ple_embed = nullptr;       // [ple_vocab, L D] embed_tokens_per_layer
  uint16_t* ple_model_proj = nullptr;  // [L D, hidden] per_layer_model_projection
  float* ple_proj_norm = nullptr;      // [D] per_layer_projection_norm
  float* ple = nullptr;                // [T, L D] per-layer inputs of the step
  float* ple_tok = nullptr;            // [T, L D] scaled embed_tokens_per_layer rows
  float* ple_gate = nullptr;           // [T, D]
  uint16_t* ple_act = nullptr;         // [T, D]
  uint16_t* xb = nullptr;              // [T, hidden] bf16 copy of the residual stream
  uint16_t* moe_in = nullptr;          // [T, hidden] router input, then the experts' input
  float* moe_out = nullptr;            // [T, hidden] experts' weighted sum

  // Step metadata: one pinned host block mirrored by one device block, same offsets.
  char* meta_host = nullptr;
  char* meta_dev = nullptr;
  size_t meta_bytes = 0;
  size_t off_tokens = 0, off_positions = 0, off_slots = 0, off_tables = 0, off_q_start = 0, off_pos0 = 0,
         off_tile_seq = 0, off_tile_q0 = 0, off_row_map = 0;
  // Window paging (CudaModelOptions::kv_window_blocks): the sliding-window layers' block tables
  // [S, max_blocks_per_seq] and slot mapping [T] (empty otherwise).
  size_t off_window_tables = 0, off_window_slots = 0;
  // Delayed quantization: each sequence's codec-pool blocks [S] (SeqSpan::n_quant_blocks).
  size_t off_quant = 0;
  cudaEvent_t meta_copied = nullptr;
  bool meta_pending = false;

  template <class T>
  T* host(size_t off) const { return reinterpret_cast<T*>(meta_host + off); }
  template <class T>
  T* dev(size_t off) const { return reinterpret_cast<T*>(meta_dev + off); }
};

namespace model_parts {

struct Dims {
  int64_t H, V, nh, nkv, hd, I, L, qkv_rows;
  int64_t E, top_k, mI, n_sparse;  // MoE: experts, experts per token, expert inter, sparse layers
};

Dims dims_of(const ModelConfig& c);
inline size_t align256(size_t b) { return (b + 255) & ~size_t(255); }
// Bytes the arena needs: weights (bf16 matrices, f32 vectors) and step scratch.
// random_fp8 (CudaModelOptions) counts the layer matrices the FP8 sinks quantize at one byte a
// weight plus their block scales; a checkpoint's FP8 matrices are counted as bf16 (a module
// its config leaves unconverted uploads as bf16).
size_t arena_bytes(const Dims& d, const CudaModelOptions& o, bool tied, int n_rope_types);
// Takes arena pieces for the step scratch and metadata.
Status take_scratch(DeviceArena& arena, const Dims& d, const CudaModelOptions& o, CudaDecoder::Buffers* b, void** workspace);
// Distinct layer types in order, and each layer's index into them.
std::vector<std::string> rope_types(const ModelConfig& cfg, std::vector<int32_t>* index);
Result<uint16_t*> upload_bf16(DeviceArena& arena, const std::vector<float>& v, const std::string& what);
Result<float*> upload_f32(DeviceArena& arena, const std::vector<float>& v, const std::string& what);

// Gemma 4 (cuda_gemma4.cpp): sets cfg's head_dim, n_heads, n_kv_heads and intermediate to the
// largest per-layer ones (what the step buffers and the KV pool's rows are sized for), and the
// arena bytes its per-layer inputs, MoE blocks and extra scratch add to arena_bytes of that
// shape (rope tables included).
Status gemma4_shape(ModelConfig* cfg);
Result<size_t> gemma4_extra_bytes(const ModelConfig& cfg, const CudaModelOptions& o);

}  // namespace model_parts
}  // namespace strata::cuda
