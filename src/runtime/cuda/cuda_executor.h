// CudaExecutor: the engine's StepExecutor over a CudaDecoder. Weights and the KV block pool
// live on the device; the engine plans with exactly the device pool's block count. A step
// hands back the device's greedy token for rows that need no logits and copies only the rows
// the engine samples or scores on the host.
//
// make_cuda_engine_parts() is what `--device cuda` builds: the decoder (weights from the
// checkpoint or drawn on the device), the executor, and a shape-only Model the Engine reads
// config and KV layout from (its forward is never called).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/cuda/device_memory.h"
#include "backend/cuda/kv_transfer.h"
#include "backend/cuda/sampling.h"
#include "kv/codec/kv_codec_config.h"
#include "kv/kv_plan.h"
#include "model/model.h"
#include "runtime/cuda/cuda_model.h"
#include "runtime/cuda/device_logprobs.h"
#include "runtime/step_executor.h"

namespace strata::cuda {

struct CudaExecutorOverlap;  // cuda_executor_async.cpp
struct CudaExecutorOverlapFree {
  void operator()(CudaExecutorOverlap* o) const;  // frees its device and pinned buffers
};

class CudaExecutor final : public StepExecutor {
 public:
  // kv_staging_bytes: device and pinned host staging of read_blocks / write_blocks (taken
  // here, once; without it those fall back to one block at a time).
  explicit CudaExecutor(std::unique_ptr<CudaDecoder> decoder,
                        int64_t kv_staging_bytes = KvTransfer::kDefaultStagingBytes);
  ~CudaExecutor() override;

  const StepRows& run(const StepPlan& plan, const std::vector<uint8_t>& want_logits,
                      std::span<const RowSample> samples) override;
  // Overlapped steps (cuda_executor_async.cpp): a step's tokens (argmax or device-sampled)
  // are gathered on the device, fed to the next step's decodes there (CudaDecoder::
  // set_token_feed) and copied back to pinned memory; collect() waits for that copy only.
  bool supports_overlap() const override { return overlap_ != nullptr; }
  void enqueue(const StepPlan& plan, const std::vector<uint8_t>& want_logits, std::span<const RowSample> samples,
               std::span<const TokenFeed> feed, bool masks_later) override;
  void sample_enqueued(std::span<const TokenMask> masks) override;
  const StepRows& collect() override;
  int32_t vocab() const override { return decoder_->config().vocab_size; }
  int32_t n_kv_blocks() const override { return decoder_->n_kv_blocks(); }
  // The sliding-window layers' pool when they page apart (CudaModelOptions::kv_window_blocks).
  int32_t n_kv_window_blocks() const override { return decoder_->n_kv_window_blocks(); }
  // --kv-quant-start: the decoder's codec pool (CudaModelOptions::kv_quant_start).
  int32_t n_kv_quant_blocks() const override { return decoder_->n_kv_quant_blocks(); }
  void convert_kv_blocks(std::span<const int32_t> src, std::span<const int32_t> dst) override;
  bool device_argmax() const override { return true; }
  // A verify is a span of k + 1 tokens with logits at each (a prefill chunk of the decoder).
  bool verifies_drafts() const override { return true; }
  int64_t max_logit_rows() const override { return decoder_->options().max_logit_rows; }
  // Sampled rows run through the device sampler (sampling.h) when its scratch could be taken
  // at creation (rows with logprobs only when device_logprobs()).
  bool device_sampling() const override { return sampling_ != nullptr && sampling_on_; }
  // Off: sampled rows copy their logits to the host sampler instead (tests compare the two).
  void set_device_sampling(bool on) { sampling_on_ = on; }
  // Rows with logprobs take them from the device sampler too (a few floats per row back, not
  // the row's logits), and so may overlap.
  bool device_logprobs() const override { return device_sampling() && logprobs_ != nullptr && logprobs_on_; }
  // Off: rows with logprobs copy their logits to the host instead. Set before the engine runs.
  void set_device_logprobs(bool on) { logprobs_on_ = on; }
  // Overlapped steps take rows with penalties: a fed row's previous token joins its penalty
  // history on the device (SamplingRow::pending).
  bool device_penalties() const override { return device_sampling() && overlap_ != nullptr; }
  // Grammar masks ride with the rows' parameters (SamplingRow::mask); an overlapped step's
  // sampling may wait for them (masks_later).
  bool device_masks() const override { return device_sampling(); }
  // The hybrid families' recurrent state slots on the device (CudaDecoder::save_state).
  int64_t state_floats() const override { return decoder_->state_floats(); }
  void save_state(int32_t slot, float* dst) override;
  void load_state(int32_t slot, const float* src) override;
  std::vector<int64_t> block_tensor_bytes() const override;
  void read_block(int32_t block, uint8_t* out) override;
  void write_block(int32_t block, const uint8_t* in) override;
  std::vector<int64_t> window_block_tensor_bytes() const override { return decoder_->kv_window_part_bytes(); }
  void read_window_blocks(std::span<const int32_t> blocks, uint8_t* out) override;
  void write_window_blocks(std::span<const int32_t> blocks, const uint8_t* in) override;
  // A gather/scatter kernel and one large copy per staging chunk (kv_transfer.h).
  void read_blocks(std::span<const int32_t> blocks, uint8_t* out) override;
  void write_blocks(std::span<const int32_t> blocks, const uint8_t* in) override;
  // Straight between the pool's staging and places in registered (pinned) host memory with
  // no host-side copy (KvTransfer::read_direct); other places go through the staging
  // (read_blocks / write_blocks), one call per run of adjacent places.
  void read_blocks_to(std::span<const int32_t> blocks, std::span<uint8_t* const> outs) override;
  void write_blocks_from(std::span<const int32_t> blocks, std::span<const uint8_t* const> ins) override;
  // Registered places: copied out on a stream of their own (KvTransfer::read_direct_async).
  uint64_t read_blocks_to_async(std::span<const int32_t> blocks, std::span<uint8_t* const> outs) override;
  uint64_t read_held_blocks_to_async(std::span<const int32_t> blocks, std::span<uint8_t* const> outs) override;
  bool reads_landed(uint64_t ticket, bool wait) override;
  // cudaHostRegister: the range becomes page-locked, copied to and from by DMA.
  bool register_host_memory(void* p, size_t bytes) override;
  void unregister_host_memory(void* p) override;

  CudaDecoder& decoder() { return *decoder_; }

 private:
  std::unique_ptr<CudaDecoder> decoder_;
  std::unique_ptr<KvTransfer> transfer_;  // null: staging could not be allocated
  std::vector<std::pair<const uint8_t*, size_t>> registered_;  // register_host_memory() ranges
  bool registered(const uint8_t* p, size_t bytes) const;
  // read_blocks_to_async (order_pool: later steps wait for the gathers) and its held variant.
  uint64_t read_async(std::span<const int32_t> blocks, std::span<uint8_t* const> outs, bool order_pool);
  StepBatch batch_;
  std::vector<int32_t> host_rows_;  // logit rows copied to the host, ascending
  std::vector<float> logits_;       // [host rows, vocab]
  StepRows rows_;
  // Device sampling: scratch, per-row parameters and the step's penalty / bias lists, taken
  // once at creation (sized for max_logit_rows rows and their whole contexts).
  struct Sampling {
    std::unique_ptr<DeviceArena> arena;
    void* workspace = nullptr;
    size_t workspace_bytes = 0;
    SamplingRow* rows = nullptr;
    int32_t* tokens = nullptr;
    int32_t* bias_ids = nullptr;
    float* bias_values = nullptr;
    int32_t* seen_ids = nullptr;
    int32_t* count_ids = nullptr;
    int32_t* count_values = nullptr;
    uint32_t* masks = nullptr;  // [max_rows, mask_words] grammar masks
    int32_t mask_words = 0;
    int64_t max_rows = 0, list_capacity = 0, bias_capacity = 0;
    // Host side of one step.
    std::vector<SamplingRow> h_rows;
    std::vector<int32_t> h_row_index;  // logit row of each sampled row
    std::vector<int32_t> h_tokens, h_bias_ids, h_seen, h_count_ids, h_count_values;
    std::vector<float> h_bias_values;
    std::vector<uint32_t> h_masks;   // [masked rows, mask_words]
    std::vector<TokenMask> by_row;   // each logit row's mask (launch_device_sampling)
  };
  std::unique_ptr<Sampling> sampling_;  // null: device sampling off
  bool sampling_on_ = true;
  std::unique_ptr<DeviceLogprobs> logprobs_;  // null: logprobs rows copy their logits
  bool logprobs_on_ = true;
  // Uploads the step's sampled rows and launches the sampler over the device logits. pinned:
  // null, the uploads read the host lists and the tokens come back to Sampling::h_tokens;
  // else the uploads are staged there (sampling_stage_bytes(samples) of room) and the tokens
  // stay on the device. pending [logit rows] (overlapped steps): for a row with penalties, the
  // index in pending_tokens (device) of its sequence's previous token, which its sampler has
  // not accepted yet (-1: none).
  void launch_device_sampling(std::span<const RowSample> samples, uint8_t* pinned = nullptr,
                              std::span<const int32_t> pending = {}, const int32_t* pending_tokens = nullptr);
  // The two halves of launch_device_sampling: the host lists from the samplers (read now: a
  // sampler may be gone by the time a deferred step samples), then the uploads and launches
  // with each logit row's mask (masks [logit rows] or empty; words null: none).
  void prepare_device_sampling(std::span<const RowSample> samples, std::span<const int32_t> pending);
  void launch_prepared_sampling(std::span<const TokenMask> masks, uint8_t* pinned, const int32_t* pending_tokens);
  size_t sampling_stage_bytes(std::span<const RowSample> samples) const;
  // Packs the plan's spans into batch_ (token ids from each sequence's tokens).
  void pack(const StepPlan& plan);
  // Overlapped steps: device and pinned buffers, the queue of at most two steps (null: off).
  std::unique_ptr<CudaExecutorOverlap, CudaExecutorOverlapFree> overlap_;
  std::vector<int32_t> pending_;  // [logit rows] of the step being queued (launch_device_sampling)
  void setup_overlap();
  // enqueue()'s second half (the sampling, the merge, the copies back) for the step in slot;
  // sample_enqueued() runs it for a step queued with masks_later.
  void finish_enqueue(int32_t slot, std::span<const TokenMask> masks);
  void abandon_enqueued();
  int32_t overlap_queued() const;
  void overlap_interrupted();  // a run() step: the next overlapped step feeds nothing
  // STRATA_PROFILE_STEPS=1: where the step time goes, logged every 256 steps: the engine's
  // host work between steps (planning, commit, streaming), packing the batch here, and the
  // device step (enqueue to the end of the copies back). Overlapped steps log their own line
  // (cuda_executor_async.cpp): the device's idle time between steps, event-timed, and the host's
  // split of a step's wall time.
  bool profile_ = false;
  int64_t prof_steps_ = 0;
  double prof_gap_ms_ = 0, prof_pack_ms_ = 0, prof_device_ms_ = 0;
  int64_t prof_tokens_ = 0;
  std::chrono::steady_clock::time_point prof_last_end_{};
};

// The KV and step limits are KvLimits' (kv/kv_plan.h; kv_blocks and kv_quant_blocks are the
// device's own). Device KV pool: kv_cache_bytes > 0 takes exactly that; else (the default here)
// gpu_memory_fraction of the device's total memory holds the weights, the step scratch and the
// KV pool (what is left).
struct CudaEngineOptions : KvLimits {
  CudaEngineOptions() { kv_cache_bytes = 0; }
  double gpu_memory_fraction = 0.9;
  bool random_weights = false;      // --load-format dummy: uniform weights drawn on the device
  uint64_t seed = 1;
  float random_scale = 0.02f;
  bool random_fp8 = false;          // --quantization fp8 with dummy weights (CudaModelOptions::random_fp8)
  bool deterministic = false;       // --deterministic: batch-invariant steps (CudaModelOptions)
  // --kv-cache-dtype / --kv-config (auto: bf16) and --kv-quant-start: N > 0 keeps a second
  // pool in the codecs (full-attention models; the pool bytes split by the KV plan,
  // kv/kv_plan.h); auto is one block where that runs and the codecs quantize
  // (fp8, int8, int4, turbo) and kv_tiers is false, else 0.
  KvCodecConfig kv_codecs;
  bool kv_tiers = false;  // the engine keeps lower KV tiers (--kv-quant-start auto is then 0)
  // Sliding-window layers page in a pool of their own as on the CPU (models with both kinds of
  // layer): kv_window_blocks > 0 takes exactly that many window blocks, 0 what the KV plan
  // gives (kv/kv_plan.h, the engine's rule). false: every layer keeps full KV.
  bool window_paging = true;
  // --speculative (not off): its --num-draft-tokens. A verify asks for k + 1 logit rows a
  // sequence, so the step's logit rows are sized for every sequence verifying at once (up to
  // the step's token budget).
  int32_t num_draft_tokens = 0;
};

struct CudaEngineParts {
  std::unique_ptr<Model> shape;  // config and KV layout for the Engine; no forward
  std::unique_ptr<CudaExecutor> executor;
  // The KV codec config the Engine must use with this pool: the request with kAuto as the
  // rows the device keeps (bf16, or f32 for split f32/f16 checkpoints), so the prefix-cache
  // namespace and the tiers' block bytes name what the pool holds.
  KvCodecConfig kv_codecs;
  bool fp8_weights = false;  // the layer matrices run on the FP8 kernels (CudaModelOptions::fp8_weights)
};

// Refuses what the CUDA engine cannot run yet, naming it and `--device cuda`: a family
// CudaDecoder lacks (cuda_family.h; recurrent state among them), KV codecs the device cannot
// store for this model (KvCodecStep::supported: head dims or GQA groups the codec kernels
// lack; a --kv-config entry naming a linear-attention layer), --kv-quant-start N > 0 on a model
// the conversion does not run for (sliding-window, shared-KV or recurrent layers) or with no
// quantizing codec.
Status check_cuda_engine_support(const ModelConfig& cfg, const KvCodecConfig& codecs);

// The --kv-quant-start the GPU runs for these codecs (auto resolved: block_size or 0), or the
// refusal of check_cuda_engine_support.
Result<int32_t> cuda_kv_quant_start(const ModelConfig& cfg, const KvCodecConfig& codecs, int32_t block_size, bool kv_tiers);

// Loads (or draws) the model in `dir` on the current device and sizes its KV pool, in the
// codecs of options.kv_codecs. The KV codec config the engine must then use is the parts'
// kv_codecs. kAuto rows are f32 for f32/f16 checkpoints (split weights) unless bf16 was asked
// for by name, else bf16.
Result<CudaEngineParts> make_cuda_engine_parts(const std::string& dir, const CudaEngineOptions& options);

// The engine's KV codec config for a device pool whose kAuto rows are bf16 (f32_rows false)
// or f32: `requested` with auto as bf16 in the first case, unchanged in the second (the
// engine's kAuto is f32 rows).
KvCodecConfig cuda_kv_codecs(const KvCodecConfig& requested, bool f32_rows);

// The window a model's sliding-window layers page apart with on the GPU (both kinds of layer,
// no linear attention); 0: none page apart.
int32_t cuda_window_pool_window(const ModelConfig& cfg);

// Whether a CUDA device is present.
bool cuda_device_present();

}  // namespace strata::cuda
