// The attention part of a CudaDecoder step when its KV pool holds KV codec rows (kv_codec.h):
// per layer, the QKV post-processing writes the step's K/V as bf16 rows into a small staging
// area (f32 rows: the post's f32 output, left in the QKV buffer), launch_kv_codec_write
// encodes them into the layer's pool rows (bytes as the CPU codecs'), and
// launch_kv_codec_attention reads the codec rows directly (a tile at a time in shared memory,
// never a dequantized copy of the cache) for every query token of the step: one query row per
// token with its own causal limit (and window), so decode, prefill and mixed steps take the
// same kernels. Layers have their own geometry (Gemma 4), sliding windows, and may read an
// earlier layer's rows without writing any (Gemma 4's shared KV). f32 rows (KvRowKind::kF32:
// kAuto with auto_f32, the default for split f32 checkpoints) keep q, scores, softmax and sums
// in f32. The bf16 decoder (no codec) never comes here.
//
// Delayed quantization (create() with quant_specs): the pool above holds EXACT rows (bf16, or
// f32 with auto_f32) and a second pool holds codec rows. A sequence's block-table entries
// [0, n_quant_blocks) are codec-pool ids, the rest exact-pool ids; run_layer writes the step's
// K/V exactly, then attends over the codec keys and the exact keys in two split passes whose
// partials one merge combines (one softmax over both). convert_blocks re-encodes full exact
// blocks into codec blocks; convert_all_blocks does it for every layer in one launch.
// Sliding-window layers stay exact (one pass over their own pool, as without quant).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "backend/cuda/kv_codec.h"
#include "backend/reference/kv_codec.h"
#include "core/status.h"
#include "model/model_config.h"

namespace strata::cuda {

class KvCodecStep {
 public:
  ~KvCodecStep();
  KvCodecStep(const KvCodecStep&) = delete;
  KvCodecStep& operator=(const KvCodecStep&) = delete;

  // The attention geometry of each pool layer: heads, head dim, window (0: none), the pool
  // layer whose rows it reads (itself, or a Gemma 4 KV source) and its model layer (the turbo
  // rotation seed, kv_rotation_seed(model_layer, head), and the index of its spec). Every model
  // layer is a pool layer, but for the gated-DeltaNet hybrids (qwen3_next, qwen3_5_text,
  // qwen3_5_moe_text): one entry per full-attention layer in order, as their pool holds them.
  // kUnsupported for linear-attention layers of other model types.
  struct LayerGeometry {
    int32_t n_heads = 0, n_kv_heads = 0, head_dim = 0, window = 0, kv_layer = 0, model_layer = 0;
  };
  static Result<std::vector<LayerGeometry>> geometry(const ModelConfig& cfg);

  // Empty Status when the GPU takes these per-layer specs (resolved, one per MODEL layer; kAuto
  // is bf16, or f32 rows with auto_f32) for cfg (as parsed: Gemma 4's per-layer geometry comes
  // from it): every pool layer attention over KV rows (full, sliding-window or shared; a
  // hybrid's linear-attention layers have no rows and their specs are not read), rows
  // the kernels handle (kv_codec_gpu_problem), GQA group 1, 2, 4 or 8; else kUnsupported
  // naming the layer or model type.
  // Non-empty quant_specs (delayed quantization, one resolved spec per model layer): specs must be the
  // exact pool's rows (every layer kBf16, or kAuto: bf16, f32 with auto_f32) and quant_specs
  // rows the kernels handle; sliding-window layers keep exact rows (their quant spec is not
  // read, their blocks never convert: the decoder pages them apart), layers reading another
  // layer's KV are refused.
  static Status supported(const ModelConfig& cfg, const std::vector<KvCodecSpec>& specs, bool auto_f32 = false,
                          const std::vector<KvCodecSpec>& quant_specs = {});
  // supported(), then scratch for steps of up to max_tokens tokens and max_seqs sequences.
  static Result<std::unique_ptr<KvCodecStep>> create(const ModelConfig& cfg, const std::vector<KvCodecSpec>& specs,
                                                     int32_t max_tokens, int32_t max_seqs, bool auto_f32 = false,
                                                     const std::vector<KvCodecSpec>& quant_specs = {});
  // Device bytes create() takes for these sizes (the largest layer's heads and head dim); quant:
  // with quant_specs (partials for two passes, the codec key counts).
  static int64_t scratch_bytes(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim, int32_t max_tokens, int32_t max_seqs,
                               bool quant = false);
  // Whether any spec stores rows other than bf16 (else the plain bf16 pool serves).
  static bool any_codec(const std::vector<KvCodecSpec>& specs, bool auto_f32 = false);

  // Row bytes of each pool part (KvPoolLayout::row_bytes: pool layer l's K, then its V).
  // Layers here (k_format, run_layer, ...) are pool layers.
  std::vector<int32_t> row_bytes() const;
  const KvRowLayout& k_format(int layer) const { return k_[size_t(layer)]; }
  const KvRowLayout& v_format(int layer) const { return v_[size_t(layer)]; }
  // Delayed quantization: whether create() had quant_specs, and the codec pool's row bytes
  // (layer l's K, then its V, as row_bytes()).
  bool has_quant() const { return !qk_.empty(); }
  std::vector<int32_t> quant_row_bytes() const;
  const KvRowLayout& quant_k_format(int layer) const { return qk_[size_t(layer)]; }
  const KvRowLayout& quant_v_format(int layer) const { return qv_[size_t(layer)]; }

  // Key splits of a step of n_tokens query rows: enough blocks for the device at decode sizes,
  // one for prefill-sized steps (whose query rows already fill it); 1 when deterministic (a
  // row's key order must not depend on the batch). Depends on n_tokens only (decode graphs).
  int32_t splits_for(int64_t n_tokens, bool deterministic) const;
  // Split blocks (KV head x split x query row) a step aims for, process-wide (default 1024; for
  // benchmarks: takes effect with the next decode graph capture, CudaDecoder::clear_cuda_graphs).
  static void set_target_blocks(int64_t blocks);
  static int64_t target_blocks();

  // After the step's metadata copy: each token's key count and sequence (device arrays here).
  // Quant mode: n_quant_blocks (device, [n_seqs]; null: none) gives each sequence's codec-pool
  // blocks (its block-table entries [0, n_quant_blocks[s])), block_size the pools' block size.
  void begin_step(const int32_t* positions, const int32_t* seq_q_start, int32_t n_tokens, int32_t n_seqs,
                  cudaStream_t stream, const int32_t* n_quant_blocks = nullptr, int32_t block_size = 0);
  // The attention output's lo part (bf16(o - out), [max_tokens, n_heads * head_dim]) for
  // split-input GEMMs, written by every later run_layer; null: none. With it, codec rows are
  // encoded from the post's f32 K/V rather than its bf16 staging.
  void set_out_lo(uint16_t* lo) { out_lo_ = lo; }

  // One layer: post (launch_qkv_post's arguments for the step, q to post.q_out; its k/v pools
  // and slot mapping are replaced by the staging here; n_kv_heads 0: a layer reading another
  // layer's rows), the encode of K and V into the pool parts of the layer's KV layer (none for
  // such a layer), then attention of the step's n_tokens query rows over those rows into out.
  // attn supplies q, out, block_tables, the shapes, window, scale and softcap. k_pool / v_pool:
  // the parts of geometry's kv_layer. Quant mode: k_pool / v_pool are the exact pool's parts
  // (the step's K/V are written there as exact rows) and qk_pool / qv_pool the codec pool's; each
  // query row attends over keys [0, n_quant_blocks * block_size) in the codec rows and the rest
  // of its keys in the exact rows, one softmax over both.
  void run_layer(int32_t layer, QkvPostArgs post, const PagedAttentionArgs& attn, const int64_t* slot_mapping,
                 uint8_t* k_pool, uint8_t* v_pool, int32_t n_splits, cudaStream_t stream,
                 const uint8_t* qk_pool = nullptr, const uint8_t* qv_pool = nullptr);
  // The attention part of run_layer alone, over rows already written (tests): attn.n_tokens
  // query rows, q (bf16, attn.q) and, for f32 rows, q_f32 (row t's head h at
  // q_f32[t * q_stride + h * head_dim]).
  void attend(int32_t layer, const PagedAttentionArgs& attn, const float* q_f32, int64_t q_stride, const uint8_t* k_pool,
              const uint8_t* v_pool, int32_t n_splits, cudaStream_t stream, const uint8_t* qk_pool = nullptr,
              const uint8_t* qv_pool = nullptr);
  // Quant mode: encodes the exact pool's blocks src_blocks[i] (device array [n_blocks]) of
  // `layer` into the codec pool's blocks dst_blocks[i], K and V, every position of each block:
  // the bytes reference::kv_encode_row gives for the exact rows' values (the layer's turbo
  // rotation seed, as run_layer). k_pool / v_pool, qk_pool / qv_pool: the layer's parts.
  void convert_blocks(int32_t layer, const uint8_t* k_pool, const uint8_t* v_pool, uint8_t* qk_pool, uint8_t* qv_pool,
                      const int32_t* src_blocks, const int32_t* dst_blocks, int32_t n_blocks, int32_t block_size,
                      cudaStream_t stream);
  const LayerGeometry& layer_geometry(int layer) const { return geom_[size_t(layer)]; }
  // Quant mode: convert_blocks for every layer, K and V. exact_parts / codec_parts: each pool's
  // parts (layer l's K at 2 l, its V at 2 l + 1). One launch for all of them when every layer
  // has the same codec rows, exact rows and KV heads (and fused_convert() is on), else
  // convert_blocks layer by layer; the bytes are the same either way. The part pointers are
  // copied to the device when they change (the first call, in practice).
  void convert_all_blocks(const std::vector<const uint8_t*>& exact_parts, const std::vector<uint8_t*>& codec_parts,
                          const int32_t* src_blocks, const int32_t* dst_blocks, int32_t n_blocks, int32_t block_size,
                          cudaStream_t stream);
  // Whether convert_all_blocks takes the one-launch path when it can, process-wide (default
  // on; off: layer by layer, for tests and benchmarks).
  static void set_fused_convert(bool on);
  static bool fused_convert();
  // Whether convert_all_blocks can take the one-launch path (every layer alike).
  bool uniform_convert() const { return uniform_convert_; }

 private:
  KvCodecStep() = default;
  std::vector<KvRowLayout> k_, v_;
  std::vector<KvRowLayout> qk_, qv_;  // quant mode: the codec pool's rows (empty otherwise)
  std::vector<LayerGeometry> geom_;
  uint16_t* out_lo_ = nullptr;
  int32_t n_heads_ = 0, n_kv_heads_ = 0, head_dim_ = 0, max_tokens_ = 0;
  int64_t partial_rows_ = 0;  // query rows x splits the partial buffers hold (per pass in quant mode)
  void* mem_ = nullptr;       // one allocation for everything below
  uint16_t* k_stage_ = nullptr;   // [max_tokens, n_kv_heads, head_dim] bf16
  uint16_t* v_stage_ = nullptr;   // [max_tokens, n_kv_heads, head_dim] bf16
  int64_t* stage_slots_ = nullptr;  // [max_tokens] 0, 1, 2, ...: token t's staging row
  int32_t* context_lens_ = nullptr;  // [max_tokens]
  int32_t* query_seq_ = nullptr;     // [max_tokens]
  int32_t* quant_lens_ = nullptr;    // [max_tokens] quant mode: codec keys of each query row
  float* partial_out_ = nullptr;     // [partial_rows (x2 quant), n_heads, head_dim]
  float* partial_ml_ = nullptr;      // [partial_rows (x2 quant), n_heads, 2]
  // One-launch conversion (convert_all_blocks): whether every layer allows it, the part
  // pointers on the device ([4 * n_layers]: exact parts, then codec parts) and the host copy they
  // were set from, and turbo3's sign words of every layer ([n_layers, 256], turbo3 values only).
  bool uniform_convert_ = false;
  void* convert_mem_ = nullptr;
  std::vector<const uint8_t*> convert_parts_;
  const uint32_t* turbo_signs_ = nullptr;
};

}  // namespace strata::cuda
