// CudaDecoder: the GPU forward of the pre-norm decoder families of model/decoder.h (llama,
// mistral, qwen2, qwen3, qwen3_moe, gemma2, gemma3_text and its multimodal wrapper's text
// path) in bf16 weights with an f32 residual stream. It reads the shared ModelConfig and
// the checkpoint through model/ (config parsing, weight names, RoPE tables are not forked),
// keeps every weight in one DeviceArena and the KV cache in one KvBlockPool, and allocates
// nothing once created: a step only copies its metadata (tokens, positions, block tables)
// to the device in one transfer.
//
// Layer: x += o(attn(rope(norm_q/k(qkv(norm_in(x)))))); x += down(act(gate(h)) * up(h)),
// h = norm_post(x), with the residual adds fused into the next RMSNorm.
// Gemma 2/3 (family_kernels.h): (1 + w) norms, sandwich norms (each branch output is normed
// before its residual add), embedding times sqrt(hidden), GELU-tanh, query_pre_attn_scalar,
// attention and final logit soft-caps. Sliding-window layers page in a pool of their own
// (CudaModelOptions::kv_window_blocks, SeqSpan::window_block_table) or keep full KV in the one
// pool (every layer's block table is the sequence's table); attention applies the window.
// MoE layers (qwen3_moe, moe.h): router GEMM, device top-k routing, experts as grouped GEMMs
// over the tokens sorted by expert. Gemma 4 (gemma4_text, cuda_gemma4.cpp): per-layer head
// dims, value norm, partial ('proportional') RoPE on full layers, per-layer input embeddings,
// KV shared by the last layers, an MoE block beside the dense MLP, layer scalars. The
// gated-DeltaNet hybrids (qwen3_next, qwen3_5_text, qwen3_5_moe_text; cuda_hybrid.h): linear-
// attention layers with per-sequence state slots, gated full attention, shared-expert MoE; the
// KV pool holds their full-attention layers only. Only the plain families take the fused
// decode path.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_ops.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"
#include "backend/reference/kv_codec.h"
#include "core/status.h"
#include "model/kv_storage.h"
#include "model/model_config.h"
#include "model/safetensors.h"
#include "model/step_batch.h"
#include "model/weight_manifest.h"
#include "runtime/cuda/cuda_family.h"
#include "runtime/cuda/cuda_kv_codec_step.h"

namespace strata::cuda {

struct CudaModelOptions {
  int64_t kv_cache_bytes = int64_t(1) << 30;  // size of the KV block pool
  int32_t block_size = 16;                    // tokens per KV block
  int32_t max_tokens = 4096;                  // tokens of one step, over all sequences
  int32_t max_seqs = 64;                      // sequences of one step
  int32_t max_blocks_per_seq = 512;           // block-table width: context <= this * block_size
  int32_t max_logit_rows = 64;                // rows of logits one step may ask for
  // Decode steps (every sequence one token, one logit row each) replay a CUDA graph per batch
  // size, captured the second time that size is seen (the first runs plainly, loading modules
  // and GEMM plans outside the capture).
  bool cuda_graphs = true;
  // Apply attn_logit_softcapping (Gemma 2) as the architecture defines it; false reproduces
  // transformers 5's default attention, which drops it (see LoadOptions::attn_softcap).
  bool attn_softcap = true;
  // Batch-invariant steps: a sequence's logits do not depend, bit for bit, on which other
  // sequences share its steps. Every linear layer keeps one cuBLASLt algorithm per shape for
  // any row count, without split-K (Gemm::set_batch_invariant); no GEMV and no fused decode;
  // attention runs unsplit (one key range per query tile) in the kernel prefill tiles take,
  // decode tokens included. The MoE grouped GEMM, norms and sampling are per row already.
  bool deterministic = false;
  // Matrices of checkpoints stored wider than bf16 (f32, f16) kept as a bf16 pair, hi + lo with
  // lo = bf16(w - hi): every linear layer is then two bf16 tensor-core GEMMs summed in f32 (and
  // the norm outputs that feed them are split the same way), the embedding rows add their lo
  // part, and the fused decode path is off. kAuto: on for such checkpoints only (a log line
  // says so); bf16 checkpoints and random() weights never split.
  enum class SplitWeights : uint8_t { kAuto, kOff, kOn };
  SplitWeights split_weights = SplitWeights::kAuto;
  // With split weights: the norm outputs and the gated MLP activation feeding the GEMMs are
  // split too (their lo recomputed in f32; a third GEMM adds x_lo . hi^T). false: weights only.
  bool split_inputs = true;
  // KV codec of each layer (resolve_kv_codecs; kAuto is bf16, or f32 with split weights).
  // Empty or all bf16: the bf16 pool and kernels, except with split weights (f32/f16
  // checkpoints), where empty means f32 rows and f32 attention in every layer (a log line says
  // so; models the f32 path does not take keep bf16). Otherwise the pool holds each layer's
  // codec rows and every step's attention runs through KvCodecStep (cuda_kv_codec_step.h);
  // no fused decode. Not for the hybrid families.
  std::vector<KvCodecSpec> kv_codecs;
  // Sliding-window layers page in a KV pool of their own, as the engine's window pool (Gemma 2/3/4
  // with both kinds of layer), read and written through SeqSpan::window_block_table; the pool
  // splits kv_cache_bytes by the one KV plan (kv/kv_plan.h): kv_window_blocks > 0 exactly that
  // many window blocks, 0 what the plan gives. false: every layer keeps full KV in the one pool
  // and reads the sequence's table (the window applied in attention only).
  bool kv_window_paging = false;
  int32_t kv_window_blocks = 0;
  // Whether kAuto rows may be f32 with split weights (kv_codecs above). false: the caller asked
  // for bf16 rows by name (--kv-cache-dtype bf16), so they stay bf16 for any checkpoint dtype.
  bool auto_kv_f32 = true;
  // Delayed quantization (--kv-quant-start, engine/kv_conversion.h): kv_quant_start > 0 with one
  // resolved codec per layer here (kv_codecs above then empty). The pool above holds exact rows
  // (bf16, or f32 with split weights) and a second pool the codec rows; kv_cache_bytes is split
  // between them by the KV plan (kv/kv_plan.h). Sequences' block-table entries
  // [0, SeqSpan::n_quant_blocks) are ids in the codec pool; every step attends through
  // KvCodecStep over both. Full-attention models only (KvCodecStep::supported).
  int32_t kv_quant_start = 0;
  std::vector<KvCodecSpec> kv_quant_codecs;
  // FP8 weights (backend/cuda/fp8.h) of the decoder families' layer matrices (q|k|v, o,
  // gate|up, down; embeddings, LM head, routers and experts stay bf16). kAuto: a fine-grained
  // FP8 checkpoint (quant_method fp8, 128x128 blocks) keeps its codes and block scales on the
  // device: decode rows stream them through the FP8 GEMV (weight-only), larger steps quantize
  // their activations per token and 128 columns and run block-scaled FP8 GEMMs. kDequantize:
  // such checkpoints are dequantized at load and run as any other (weight-only FP8).
  // --deterministic always dequantizes (its batch-invariant GEMMs are bf16).
  enum class Fp8Weights : uint8_t { kAuto, kDequantize };
  Fp8Weights fp8_weights = Fp8Weights::kAuto;
  // random(): the layer matrices drawn in bf16 as usual, then quantized to FP8 blocks and kept
  // as a fine-grained FP8 checkpoint's would be (--load-format dummy --quantization fp8).
  bool random_fp8 = false;
};

class CudaDecoder {
 public:
  ~CudaDecoder();
  CudaDecoder(const CudaDecoder&) = delete;
  CudaDecoder& operator=(const CudaDecoder&) = delete;

  // A Hugging Face directory of a supported family; weights converted to bf16 on upload.
  static Result<std::unique_ptr<CudaDecoder>> load(const std::string& dir, const CudaModelOptions& options);
  // The same architecture with weights uniform in [-scale, scale], drawn on the device
  // (benchmarks of models whose weights would not travel). Norm weights are 1. Not for
  // gemma4_text (kUnsupported).
  static Result<std::unique_ptr<CudaDecoder>> random(const ModelConfig& cfg, const CudaModelOptions& options,
                                                     uint64_t seed, float scale);

  const ModelConfig& config() const { return cfg_; }
  int32_t n_kv_blocks() const;
  // Blocks of the sliding-window layers' pool (0: those layers read the full pool).
  int32_t n_kv_window_blocks() const;
  // Blocks of the codec pool of delayed quantization (0: none; CudaModelOptions::kv_quant_start).
  int32_t n_kv_quant_blocks() const;
  // Re-encodes exact-pool blocks src[i] into codec-pool blocks dst[i] (every layer), queued on
  // stream() behind the step in flight and ahead of the next step (no wait for the device).
  Status convert_kv_blocks(std::span<const int32_t> src, std::span<const int32_t> dst);
  cudaStream_t stream() const { return stream_; }
  // Bytes of all weights on the device.
  int64_t weight_bytes() const { return weight_bytes_; }
  // Turns decode-step graphs on or off from the next step (benchmarks compare both).
  void set_cuda_graphs(bool on) { opt_.cuda_graphs = on; }
  // Drops the captured decode graphs: the next decode steps capture again with the launch
  // settings then in force (set_launch_tuning, for benchmarks).
  void clear_cuda_graphs();
  // Most KV splits of a decode step's attention (1..32, default 32); takes effect with the next
  // capture (clear_cuda_graphs). For benchmarks.
  void set_max_splits(int32_t n);

  // One step over a packed batch (every span's block table must cover its positions, ids in
  // the vocabulary). Writes the greedy token of each logit row to `argmax` [n_logit_rows] and,
  // when `logits` is given, the f32 logits [n_logit_rows, vocab]. Synchronizes the stream.
  Status forward(const StepBatch& batch, int32_t* argmax, float* logits = nullptr);
  // Enqueues the step without waiting; results land in device buffers (for timing).
  Status enqueue(const StepBatch& batch);
  // As forward(), but copies only the logit rows listed in `rows` (n of them, ascending) to
  // `logits` [n, vocab]; the greedy token of every row still goes to `argmax`.
  Status forward_rows(const StepBatch& batch, int32_t* argmax, const int32_t* rows, int64_t n, float* logits);
  // The second half of forward_rows for a step already enqueued (work queued on stream() in
  // between, e.g. sampling over device_logits(), runs before the copies): the argmax of every
  // row, the n listed rows' logits, then a stream synchronize.
  Status fetch_rows(int32_t* argmax, const int32_t* rows, int64_t n, float* logits);
  // The last enqueued step's logits on the device, [n_logit_rows(), vocab] f32; valid until
  // the next step is enqueued.
  const float* device_logits() const;
  // The last enqueued step's greedy token of each logit row on the device, [n_logit_rows()].
  const int32_t* device_argmax() const;
  // Overlapped steps (CudaExecutor): every later step, right after its metadata upload (inside
  // the decode graphs too), writes prev[src[i]] into its token ids at dst[i] for i < n, with
  // desc = [n, src[max_seqs], dst[max_seqs]] in device memory, and sets n to 0 (the caller
  // uploads a feed before the step that takes it). Drops the graphs captured so far.
  void set_token_feed(int32_t* desc, const int32_t* prev);
  int64_t n_logit_rows() const { return n_logit_rows_; }
  const CudaModelOptions& options() const { return opt_; }

  // Bytes of one KV block over every layer of the full pool (sliding-window layers paged apart
  // are not in it): per layer the K rows then the V rows, [block_size, n_kv_heads] rows each
  // (bf16 [head_dim], or the layer's codec rows).
  int64_t kv_block_bytes() const;
  // Whether the pool keeps the kAuto layers' rows as f32 (split weights; else bf16): the
  // engine's KV codec config must say so (cuda_kv_codecs), as it names the prefix-cache
  // namespace and the tiers' block bytes.
  bool kv_f32_rows() const { return kv_f32_rows_; }
  // Copies KV block `block` of every layer of the full pool to / from host bytes laid out as
  // kv_block_bytes() says (waits for the stream).
  Status read_kv_block(int32_t block, uint8_t* out);
  Status write_kv_block(int32_t block, const uint8_t* in);
  // The same for blocks of the sliding-window pool over the layers paged there (block i of a
  // call at i * kv_window_block_bytes(); 0 bytes: no window pool).
  int64_t kv_window_block_bytes() const;
  std::vector<int64_t> kv_window_part_bytes() const;
  Status read_window_kv_blocks(std::span<const int32_t> blocks, uint8_t* out);
  Status write_window_kv_blocks(std::span<const int32_t> blocks, const uint8_t* in);
  // The KV pool (batched block copies, kv_transfer.h).
  const KvBlockPool& kv_pool() const { return *kv_; }
  // Device bytes the weights and step scratch of this shape take (the KV pool aside).
  static int64_t arena_bytes_for(const ModelConfig& cfg, const CudaModelOptions& options);

  // Recurrent state (the hybrid families; cuda_hybrid.h): floats of one slot over every layer
  // (0: none), and one slot copied to / from host floats in the engine's layout (per layer with
  // state its conv floats, then its recurrent floats); both wait for the stream. Slots are
  // 0 .. max_seqs - 1; SeqSpan::state_slot picks a span's.
  int64_t state_floats() const;
  Status save_state(int32_t slot, float* dst);
  Status load_state(int32_t slot, const float* src);
  // The engine's per-layer KV and recurrent-state layouts of this model (windows only when the
  // sliding-window layers page apart; Gemma 4's per-layer geometry and shared KV).
  std::vector<KvLayerSpec> kv_layout() const;
  std::vector<StateLayerSpec> state_layout() const;

  struct Layer;
  struct Buffers;
  struct Hybrid;
  // How the tensors of a fused group of manifest entries (one WeightFuse group of a layer, or a
  // single entry) reach the arena: from the checkpoint, or drawn for a dummy model.
  class WeightSink {
   public:
    virtual ~WeightSink() = default;
    // The entries' rows concatenated, bf16 (split checkpoints also keep the lo part).
    virtual Result<uint16_t*> matrix(const std::vector<const WeightEntry*>& parts) = 0;
    virtual Result<float*> vector(const std::vector<const WeightEntry*>& parts) = 0;
  };
  // An FP8 matrix a sink placed: its codes (in the arena, held as the layers hold bf16
  // matrices) and block scales [ceil(n / 128), ceil(k / 128)]; registered with the GEMM
  // (Gemm::add_fp8) once it exists.
  struct Fp8Matrix {
    const uint16_t* w = nullptr;
    const float* scales = nullptr;
    int64_t n = 0, k = 0;
  };
  // Whether the layer matrices are FP8 (set at load).
  bool fp8_weights() const { return !fp8_mats_.empty(); }

 private:
  // The shared decoder's families: the family's flags (cuda_family.h) with its activation, the
  // RoPE table of one layer type, and the manifest's weights placed through `sink` (each
  // WeightFuse group as one tensor of Layer / Buffers).
  void adopt_family(const FamilyFlags& flags, cpu::Activation act, const CudaModelOptions& options);
  Status upload_rope(const RopeConfig& rc);
  Status place_weights(const WeightManifest& manifest, WeightSink& sink);
  // Registers fp8_mats_ with gemm_ (and its activation scratch).
  Status attach_fp8();
  CudaDecoder();  // out of line: members hold types complete in cuda_model.cpp only
  Status init_common(const CudaModelOptions& options);
  // The device arena of the weights and step scratch (bytes from the loader's sizing).
  Status take_weight_arena(size_t bytes);
  // Launches of one step whose metadata is already in the pinned host block; record_copy
  // records Buffers::meta_copied after the metadata copy (not while capturing a graph).
  struct StepShape {
    int64_t n_tokens = 0, n_tiles = 0, n_rows = 0;
    int32_t tokens_per_tile = 1, n_splits = 1;
    bool decode = false;  // every sequence one token with its logit row
    int64_t n_seqs = 0;
    int32_t codec_splits = 1;  // KV codecs: key splits of the codec attention
  };
  void launch_step(const StepShape& shape, bool record_copy);
  void launch_fused_decode(const StepShape& shape);
  void launch_moe_ffn(const Layer& layer, int64_t n, cudaStream_t stream);
  // launch_grouped_gemm for every MoE family. kAuto picks the kernel by the step's token count,
  // so a row's rounding would depend on its batch: deterministic steps always take the tiled one.
  void grouped_gemm(GroupedGemmArgs args, cudaStream_t stream) const;
  // Gemma 4 (cuda_gemma4.cpp): the loader (cfg already resolved against the archive) and the
  // step after the metadata copy.
  static Result<std::unique_ptr<CudaDecoder>> load_gemma4(const ModelConfig& cfg, std::shared_ptr<const SafetensorsArchive> archive,
                                                          const CudaModelOptions& options);
  void launch_gemma4_step(const StepShape& shape);
  void launch_gemma4_moe(const Layer& layer, int64_t n, cudaStream_t stream);
  // The hybrids (cuda_hybrid.cpp): the loader, the step's state-slot metadata (after the
  // batch checks of enqueue) and the step after the metadata copy.
  // A null archive gives a dummy: weights drawn from the manifest's inits (`seed`, matrices
  // uniform in [-scale, scale]).
  static Result<std::unique_ptr<CudaDecoder>> load_hybrid(const ModelConfig& cfg, std::shared_ptr<const SafetensorsArchive> archive,
                                                          const CudaModelOptions& options, uint64_t seed = 0, float scale = 0.0f);
  Status fill_hybrid_meta(const StepBatch& batch);
  void launch_hybrid_step(const StepShape& shape, bool record_copy);
  void launch_hybrid_ffn(size_t layer, int64_t n, cudaStream_t stream);
  // Window paging: span s's window block table into the step metadata (need: its blocks).
  Status fill_window_table(const SeqSpan& span, int64_t s, int64_t need);
  QkvPostArgs qkv_post_args(size_t layer) const;
  PagedAttentionArgs attention_args(const StepShape& shape, size_t layer) const;

  ModelConfig cfg_;
  CudaModelOptions opt_;
  bool qk_norm_ = false;
  bool qkv_bias_ = false;
  bool o_bias_ = false;
  int32_t act_ = 0;  // Act
  float attn_scale_ = 1.0f;
  // Family settings beyond the plain layer (see the top of this file).
  bool one_plus_w_ = false;
  bool sandwich_ = false;
  float embed_scale_ = 1.0f;
  float attn_softcap_ = 0.0f;
  float final_softcap_ = 0.0f;
  bool moe_ = false;
  bool fused_ok_ = true;  // the fused decode path computes this family
  bool gemma4_ = false;   // launch_gemma4_step computes the layers
  // Split weights: kAuto KV rows are f32 (set by the loaders before init_common).
  bool auto_f32_kv_ = false;
  bool kv_f32_rows_ = false;  // init_common's decision: every kAuto layer holds f32 rows
  ModelConfig attn_cfg_;  // the config as parsed when cfg_ is reshaped (Gemma 4), for KvCodecStep
  std::unique_ptr<Hybrid> hybrid_;  // the hybrid families' layers, state and step metadata
  int32_t kv_layers_ = 0;           // layers of the KV pool (0: every layer)
  int32_t max_window_ = 0;          // largest window of a layer paged apart (0: none page apart)
  int32_t ple_dim_ = 0;   // Gemma 4 per-layer input width (0: none)
  float ple_embed_scale_ = 1.0f;
  int64_t weight_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<DeviceArena> arena_;
  std::unique_ptr<KvBlockPool> kv_;
  std::unique_ptr<KvCodecStep> codec_;  // null: bf16 KV
  std::unique_ptr<KvBlockPool> quant_kv_;  // delayed quantization's codec pool (null: none)
  int32_t* convert_ids_ = nullptr;         // [2, convert_cap_] device: convert_kv_blocks' src, dst
  int64_t convert_cap_ = 0;
  struct ConvertStaging {
    int32_t* ids = nullptr;          // [2, convert_cap_] pinned
    cudaEvent_t copied = nullptr;    // its copy to convert_ids_ has run
    bool pending = false;
  };
  ConvertStaging convert_host_[2];
  int convert_turn_ = 0;
  std::unique_ptr<Gemm> gemm_;
  std::vector<Fp8Matrix> fp8_mats_;
  std::vector<Layer> layers_;
  std::unique_ptr<Buffers> buf_;
  int64_t n_logit_rows_ = 0;  // of the last enqueued step
  int32_t* feed_desc_ = nullptr;  // set_token_feed (null: no feed)
  const int32_t* feed_prev_ = nullptr;
  int32_t max_splits_ = 32;
  // The M at which the batch-invariant GEMM algorithm of each shape is ranked (deterministic).
  static constexpr int64_t kInvariantGemmRows = 256;
  std::map<int64_t, int32_t> decode_seen_;         // batch size -> plain decode steps run
  std::map<int64_t, cudaGraphExec_t> decode_graphs_;  // batch size -> captured step
};

}  // namespace strata::cuda
