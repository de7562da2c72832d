// Engine: the batched generation engine and the only interface the HTTP layer uses.
// One engine thread owns the model, the KV block pool, the prefix cache and the scheduler;
// callers submit requests and read their events through RequestStreams (request_queue.h holds
// all the locking). Each step: take new requests and cancellations, plan (scheduler.h), run
// one packed forward (model_runner.h), sample, stream tokens, publish full blocks, release
// finished sequences.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/status.h"
#include "engine/lora_registry.h"
#include "engine/request.h"
#include "engine/request_queue.h"
#include "engine/speculative.h"
#include "kv/codec/kv_codec_config.h"
#include "kv/kv_plan.h"
#include "model/model.h"
#include "runtime/step_executor.h"

namespace strata {

// The KV and step limits (kv_cache_bytes, kv_blocks, kv_window_blocks, kv_quant_blocks,
// block_size, max_batch_tokens, max_num_seqs, max_model_len) are KvLimits' (kv/kv_plan.h), which
// sizes the pools: sliding-window layers page in a pool of their own that holds only what each
// sequence's window needs, and --kv-quant-start keeps a second pool in the codecs.
struct EngineOptions : KvLimits {
  int32_t max_queued = 256;          // submitted but not yet admitted; past it submit fails
  // LoRA adapters a request may name (GenerationRequest::adapter): name -> the model's slot
  // (Model::add_lora). The host executor only so far.
  std::map<std::string, int32_t> lora_slots;
  std::string scheduling_policy = "fcfs";  // "fcfs" or "priority"
  bool prefix_caching = true;
  double session_ttl_s = 600.0;      // pin of a session's blocks after its request ends
  // The state identity (engine/state_identity.h: the weights' and config's content, quantization
  // and adapters, the backend's arithmetic; tests pass any name). With the model's shape, the KV
  // codecs and the block size it forms the prefix namespace, which salts block hashes, names
  // the disk tier's files and is carried and checked by every checkpoint.
  std::string model_identity;
  std::vector<int32_t> eos_ids;      // empty: the model config's EOS ids
  // Hybrid (recurrent-state) families with prefix caching: the state is snapshotted every this
  // many tokens (a multiple of block_size) and at the prompt's last block boundary, so prefix
  // hits restore it exactly; snapshots live in host memory under this budget, LRU.
  int32_t state_snapshot_interval = 512;
  int64_t state_snapshot_bytes = int64_t(256) << 20;
  // Lower KV tiers (kv/host/kv_tiers.h): published blocks the pool evicts demote to host memory
  // under kv_host_bytes (0: no host tier) and, through a background writer, to files in
  // kv_disk_dir (empty: no disk tier) under kv_disk_bytes; a prefix lookup continues there.
  // Only for models without sliding-window layers or recurrent state (else tiers stay off).
  int64_t kv_host_bytes = 0;
  std::string kv_disk_dir;
  int64_t kv_disk_bytes = int64_t(4) << 30;
  double kv_flush_timeout_s = 10.0;  // shutdown waits this long for the disk writer
  double kv_disk_read_delay_s = 0.0; // > 0: every disk-tier block read sleeps this long (tests of a slow disk)
  // The shared tier (kv/redis/redis_tier.h) under them: redis://[:password@]host:port/db
  // (empty: none); its writer queue holds at most kv_redis_queue_bytes.
  std::string kv_redis_url;
  int64_t kv_redis_queue_bytes = int64_t(256) << 20;
  // The codec each layer stores its KV in (default: auto, the compute dtype). Resolved against
  // the model at create(); the pools are sized by the codec'd bytes per token and the codec
  // config is part of the prefix-cache namespace. quant_start > 0 (--kv-quant-start): the pool
  // above holds exact KV and a second pool the codecs; a sequence's full blocks move there once
  // it passes quant_start tokens (engine/kv_conversion.h, which says how the bytes are split).
  // kQuantStartAuto: default_kv_quant_start below (the CLI's default); the engine's options()
  // then hold the resolved count.
  KvCodecConfig kv_codecs;
  // Generation checkpoints (engine/checkpoint.h): every this many generated tokens an in-flight
  // request persists its generated ids, sampler state and (through the disk tier) its KV; an
  // identical request later resumes there. 0: off. Requests asking for logprobs are not
  // checkpointed. checkpoint_dir empty: <kv_disk_dir>/checkpoints.
  int32_t checkpoint_every = 0;
  std::string checkpoint_dir;
  // "file" (checkpoint_dir) or "redis" (the kv_redis_url server: replicas resume each other's).
  std::string checkpoint_store = "file";
  // Checkpoints are written by a thread of their own (engine/checkpoint_writer.h); the
  // snapshots waiting for it hold at most this many bytes (past it a write is dropped, counted).
  int64_t checkpoint_queue_bytes = int64_t(64) << 20;
  // Overlapped ("async") scheduling on executors that support it (a GPU): while step n runs,
  // the host commits it with placeholder tokens, plans step n+1 and queues it with n's tokens
  // fed on the device, then reads n's tokens. Only steps whose every request takes its tokens
  // from the device overlap (no prompt logprobs, checkpoints, KV tiers or recurrent state;
  // logprobs and penalties only where the executor handles them); the rest run one step at a
  // time. Same tokens either way.
  bool async_scheduling = true;
  // Speculative decoding (engine/speculative.h): --speculative, --num-draft-tokens, --draft-model.
  SpeculativeOptions speculative;
  // Token fill for constrained requests (engine_grammar.cpp): where the grammar admits one
  // token only, it is appended without sampling and run with the next step's forward. Off for
  // requests with logprobs and for families with recurrent state. Same tokens either way.
  bool token_fill = true;
};

// The model's kv_layout() with each layer's codec resolved from `config` (resolve_kv_codecs):
// errors name the flag and value (an unknown layer, a group size that does not fit the head
// dim, ...). quant_start > 0 is kUnsupported here: the engine converts sequences itself and
// calls this with quant_start 0 for each of its two layouts.
Result<std::vector<KvLayerSpec>> resolve_kv_layout(const Model& model, const KvCodecConfig& config);

// The pools the engine sizes for `model` under `options` (kv/kv_plan.h) as one line, the
// options' errors as create() gives them (`strata inspect`).
Result<std::string> describe_kv_plan(const Model& model, const EngineOptions& options);

class StepExecutor;
// What --kv-quant-start auto stands for: one block when some layer stores fp8, int8, int4 or
// turbo and the engine can convert this model's KV (every attention layer full, no recurrent
// state, no lower KV tiers, and on an executor one that keeps a codec pool); else 0 (every
// row in the codec from the start). With one block, every full block is in the codec and the
// block a sequence is writing stays exact: on strata-demo that cuts the mean KL of fp8 from
// 1.8e-3 to 6.8e-4 and of int4 from 4.6e-2 to 1.9e-2 (bench/RESULTS.md) for at most two
// exact blocks per running sequence.
int32_t default_kv_quant_start(const Model& model, const EngineOptions& options, const StepExecutor* executor = nullptr);

class Engine {
 public:
  // Refuses options that cannot work (kInvalidArgument) with a message naming the option and
  // its value, and models whose KV layout it cannot page (kUnsupported: a layer sharing the KV
  // of a layer of the other attention kind, or no attention KV at all).
  static Result<std::unique_ptr<Engine>> create(std::unique_ptr<Model> model, EngineOptions options);
  // Runs the steps on `executor` (runtime/step_executor.h, e.g. a GPU) instead of a host
  // ModelRunner; `model` then only describes the shapes (config, KV and state layout) and its
  // forward is never called. The engine plans with exactly executor->n_kv_blocks() blocks
  // (options.kv_blocks must be 0 or that count).
  static Result<std::unique_ptr<Engine>> create(std::unique_ptr<Model> model, EngineOptions options,
                                                std::unique_ptr<StepExecutor> executor);
  // As create(); throws std::invalid_argument with the same message on refusal.
  Engine(std::unique_ptr<Model> model, EngineOptions options, std::unique_ptr<StepExecutor> executor = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts the engine thread. Requests submitted before wait for it.
  void start();
  // Validates and queues a request. kInvalidArgument names the field and value (an over-long
  // request names prompt length, max_tokens and max_model_len); kResourceExhausted when
  // max_queued requests are waiting already.
  Result<std::shared_ptr<RequestStream>> submit(GenerationRequest request);
  // Cancels a live request by id; its blocks are freed within one step. False if unknown.
  bool cancel(const std::string& id);
  EngineStats stats() const;
  // Stops the thread; requests still live end with finish reason cancelled. Idempotent.
  void shutdown();
  // Waits up to timeout_s for the KV disk tier's writer queue to drain. True when nothing is
  // left queued (or there is no disk tier). Thread-safe.
  bool flush_kv_tiers(double timeout_s);
  // Waits up to timeout_s for the checkpoint writer (engine/checkpoint_writer.h) to write and
  // remove everything queued. True when nothing is left (or checkpoints are off). Thread-safe.
  bool flush_checkpoints(double timeout_s);
  // LoRA adapters at run time (thread-safe): load reads `dir` on the calling thread and serves
  // it under `name` from the next step; unload refuses new requests for it at once and frees it
  // when its last request ends. kUnsupported on an executor that applies no adapter.
  Status load_lora(const std::string& name, const std::string& dir, int32_t max_rank);
  Status unload_lora(const std::string& name);
  std::vector<std::string> lora_names() const { return lora_.names(); }
  // False once the engine thread has died (or was shut down).
  bool alive() const { return alive_.load(); }

  const ModelConfig& model_config() const { return model_->config(); }
  int32_t max_model_len() const { return max_model_len_; }
  int32_t n_kv_blocks() const { return n_blocks_; }
  // Blocks of the sliding-window layers' pool; 0 when the model has no such layer.
  int32_t n_kv_window_blocks() const { return n_window_blocks_; }
  // Blocks of the codec pool of --kv-quant-start (0: none); n_kv_blocks() is then the exact pool.
  int32_t n_kv_quant_blocks() const { return n_quant_blocks_; }
  // The options the engine runs with (executor pools adopted, --kv-quant-start auto resolved).
  const EngineOptions& options() const { return options_; }
  int32_t block_size() const { return options_.block_size; }
  // Bytes of KV one token takes over all layers that own KV, in their resolved codecs.
  int64_t kv_bytes_per_token() const { return kv_bytes_per_token_; }
  // The identity string the prefix-cache hashes are salted with (model, shape, KV codecs, ...).
  const std::string& prefix_namespace() const { return prefix_namespace_; }

 private:
  struct Active;
  struct KvPlan {
    KvPoolShape shape;                      // bytes per token of each pool, the window, recurrent state
    KvPoolPlan pools;                       // kv/kv_plan.h
    std::vector<KvLayerSpec> layout;        // the model's KV layout with each layer's resolved codec
    std::vector<KvLayerSpec> quant_layout;  // --kv-quant-start: the codec pool's layout (layout is then exact)
  };
  static Status check_model(const Model& model);
  static Result<KvPlan> plan_blocks(const Model& model, const EngineOptions& options);
  friend Result<std::string> describe_kv_plan(const Model& model, const EngineOptions& options);
  void loop();
  void run_loop();
  void admit_new(std::vector<PendingRequest> incoming);
  void step();
  void commit(const struct StepPlan& plan, const struct StepRows& rows);
  // Streams one generated token of `a` (logits: its host row, for logprobs; else null, and
  // the logprobs are row `row` of `rows`, computed by the executor) and finishes it on a stop
  // token or at max_tokens.
  // in_run: a token of a verify's accepted run, already accept()ed by the sampler, whose
  // checkpoint (if one is due) the caller writes after the run. False once `a` has finished
  // (and is gone).
  // grammar_current: a's matcher stands right after `token` (false for all but the last token
  // of a verify's run, which the matcher has passed already).
  bool emit_token(Active& a, int32_t token, const float* logits, const struct StepRows* rows = nullptr, size_t row = 0,
                  bool in_run = false, bool grammar_current = true);
  // The speculative method (engine_speculative.cpp): refuses options and executors it cannot
  // run, builds the proposer, drafts for the step's speculating decodes before planning, and
  // commits a verify span.
  static Status check_speculative(const Model& model, const EngineOptions& options, const StepExecutor* executor);
  void setup_speculation();
  // This step's drafts per decoding row (engine/speculative.h): the rows, each one's cap and
  // its draft length (0: none). No side effects.
  struct DraftChoice {
    std::vector<Active*> rows;
    std::vector<int32_t> max_k, k;
    bool any() const;
  };
  DraftChoice choose_drafts() const;
  // Counts idle rows for probing, asks the proposer for the chosen drafts and appends them.
  void propose_drafts(const DraftChoice& choice);
  void time_step_costs();  // the step before this one, for the step cost models
  void commit_verify(Active& a, const struct ScheduledSpan& span, const struct StepRows& rows, size_t first_row);
  void finish(Active& a, FinishReason reason, std::string message, int32_t stop_token = -1);
  // Constrained decoding (engine_grammar.cpp): submit's checks of a request's grammar, the
  // matcher made at admission, the replay of a checkpoint's generated ids (false: they do not
  // fit the grammar; the matcher is back at its start), and the draw of a row under the mask
  // (the matcher advanced by the token; -1: the mask allows no id of the row).
  Status check_grammar(const GenerationRequest& r) const;
  void admit_grammar(Active& a);
  bool replay_grammar(Active& a, const std::vector<int32_t>& generated);
  int32_t sample_token(Active& a, const float* logits, int32_t vocab);
  // a's next-token mask in its scratch (timed in the stats); *any: it keeps an id the sampler
  // may draw. A device-sampled token then advances the matcher through accept_device_token
  // (false: the request has failed and is gone).
  struct TokenMask next_mask(Active& a, bool* any);
  bool accept_device_token(Active& a, int32_t token);
  // Advances a's grammar state by its generated token number `position` (the reasoning
  // markers and what lies between them pass the matcher by); false: the grammar rejects it.
  bool grammar_take(Active& a, int32_t token, int32_t position);
  // Token fill: the one id a's mask admits (-1: none or several), and the loop appending such
  // ids after a committed token (false once `a` has finished and is gone).
  int32_t only_allowed_token(Active& a);
  bool fill_forced(Active& a);
  // Overlapped steps (engine_async.cpp).
  void setup_overlap();
  void admit_overlap(Active& a);
  void step_overlapped(const struct StepPlan& plan);
  // Collects the step in flight, if any, and hands its tokens to their requests.
  void drain_pipeline();
  void fail_all(const std::string& message, bool drain_queue);
  void publish_stats();
  // Opens the lower KV tiers the options ask for and hooks them to the pool and the scheduler.
  void setup_kv_tiers();
  // Shutdown: the window pool's cached blocks and the held snapshots go down to their disk tiers.
  void persist_companions();
  // Queues a's published blocks the shared KV tier lacks for it (another replica may want them).
  void share_blocks(Active& a);
  // Opens the checkpoint store when options_.checkpoint_every > 0.
  void setup_checkpoints();
  // Resumes a just-admitted request from its checkpoint, if one is stored.
  void resume_from_checkpoint(Active& a);
  // Persists a's KV blocks (disk tier) and its checkpoint file.
  void write_checkpoint(Active& a);
  // Queues the reads of the blocks checkpoints took since the last call and hands those that
  // have landed to the disk tier (wait: every one).
  void pump_checkpoint_blocks(bool wait);
  double now_s() const;

  std::unique_ptr<Model> model_;
  EngineOptions options_;
  int32_t n_blocks_ = 0;
  int32_t n_window_blocks_ = 0;
  int32_t n_quant_blocks_ = 0;
  int32_t max_model_len_ = 0;
  int64_t kv_bytes_per_token_ = 0;
  std::string prefix_namespace_;
  std::vector<int32_t> eos_ids_;
  RequestQueue queue_;
  LoraRegistry lora_;  // adapters by name; the model's slots follow it on the engine thread
  std::chrono::steady_clock::time_point t0_;

  // Engine-thread state.
  struct Core;
  std::unique_ptr<Core> core_;

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> alive_{false};
  std::atomic<bool> started_{false};
  bool tiers_persisted_ = false;
};

}  // namespace strata
