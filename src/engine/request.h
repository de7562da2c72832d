// The data the engine API exchanges with its callers: a generation request, the events of its
// stream, and the engine's statistics. Plain values, no locking (request_queue.h holds that).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kv/host/kv_tiers.h"
#include "kv/kv_cache_manager.h"
#include "kv/state_cache.h"
#include "sampling/grammar/matcher.h"
#include "sampling/logprobs.h"
#include "sampling/sampling_params.h"

namespace strata {

struct GenerationRequest {
  std::string id;                // unique among live requests (cancel(id) names it)
  std::vector<int32_t> prompt;   // token ids, at least one
  SamplingParams sampling;       // temperature 0: greedy; has_seed false: the engine draws a seed
  int32_t max_tokens = 16;       // generated tokens at most, >= 1
  std::vector<int32_t> stop_ids; // tokens that end the generation (besides EOS)
  bool ignore_eos = false;       // do not stop at the model's EOS ids
  int32_t logprobs = -1;         // -1: none; else chosen token logprob and top-N, N in [0, 20]
  bool prompt_logprobs = false;  // logprobs of the prompt tokens (echo); disables prefix reuse
  int32_t priority = 0;          // lower first under the priority policy
  std::string session_id;        // non-empty: the conversation's blocks stay pinned for the TTL
  int32_t vocab_limit = 0;       // ids >= it are never sampled; 0: the model's vocabulary
  bool speculative = true;       // false: decode one token per step even when the engine speculates
  // Constrained decoding: the compiled grammar's token masks (grammar/grammar.h, shared through
  // the server's GrammarCache; null: unconstrained) and a key naming the grammar (kind, options,
  // text), part of the checkpoint key. Every generated token is one the grammar allows; stop ids
  // only where it can end; the request finishes (stop) once the grammar is complete. Its
  // vocabulary must be the model's tokenizer's, with the engine's EOS ids among its stop ids.
  std::shared_ptr<const grammar::TokenMaskCache> grammar;
  std::string grammar_key;
  // Reasoning models: the grammar applies after the reasoning section. think_end closes it;
  // in_think: the prompt opened it, so the output is free until think_end; think_open (-1:
  // none): an id the first token may be besides the grammar's, which opens a section the
  // grammar then waits out the same way. The markers themselves pass the matcher by.
  int32_t grammar_think_open = -1;
  int32_t grammar_think_end = -1;
  bool grammar_in_think = false;
  // Embedding: the request runs its prompt only and finishes with the final hidden state of
  // its last token (last-token pooling; only on an engine whose model has hidden_output).
  bool embed = false;
  // A LoRA adapter the engine serves (EngineOptions::lora_slots), "" for the base model. Its
  // KV chains under a salt of the adapter's content, so no block is shared with the base model
  // or another adapter.
  std::string adapter;
};

enum class FinishReason { kStop, kLength, kCancelled, kError };
inline constexpr int kNumFinishReasons = 4;
const char* finish_reason_name(FinishReason r);  // "stop", "length", "cancelled", "error"

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;  // every sampled token, the stop token included
  int32_t cached_tokens = 0;      // prompt tokens served by the prefix cache
  // The speculative method (engine/speculative.h): whether the request ran it, the tokens its
  // proposer drafted and how many of them the verifies accepted.
  bool speculative = false;
  int32_t draft_tokens = 0;
  int32_t accepted_tokens = 0;
  // Token fill (constrained requests): tokens the grammar forced that were appended without
  // sampling, and the spans they came in.
  int32_t fill_tokens = 0;
  int32_t fill_spans = 0;
};

// One event of a request's stream: tokens as they are sampled, then exactly one final event.
struct StreamEvent {
  std::vector<int32_t> tokens;          // new generated tokens (never the stop token)
  std::vector<TokenLogprobs> logprobs;  // one per token when the request asked for logprobs
  // Sent once, before any token, when prompt_logprobs was asked: entry i scores prompt token
  // i + 1 (the first prompt token has no logprob), top-N as for generated tokens.
  std::vector<TokenLogprobs> prompt_logprobs;

  bool final = false;
  FinishReason finish_reason = FinishReason::kStop;  // final events only
  std::string message;     // kError: what failed
  int32_t stop_token = -1; // kStop by a stop id or EOS: that id
  Usage usage;             // final events only
  // Final event of an embed request that finished with kStop: the last prompt token's final
  // hidden state [hidden] f32, as the model wrote it (not normalized).
  std::vector<float> embedding;
  // Final events only: ms from submit() to the first step that scheduled the request (its
  // first prefill chunk; the whole life when it never left the queue), and how often the
  // scheduler preempted it for lack of KV blocks.
  double queued_ms = 0.0;
  int32_t preemptions = 0;
};

// Fixed buckets (ms, upper bounds), cumulative since the engine started; Prometheus style.
struct LatencyHistogram {
  std::vector<double> bounds_ms;
  std::vector<int64_t> counts;  // [bounds_ms.size() + 1], the last one past every bound
  double sum_ms = 0.0;
  int64_t count = 0;

  static LatencyHistogram with_default_bounds();
  static LatencyHistogram with_mask_bounds();  // 2 us to 50 ms
  void add(double ms);
};

// The generation checkpoint writer's counts (engine/checkpoint_writer.h).
struct CheckpointWriterStats {
  int64_t written = 0;    // checkpoints on disk
  int64_t coalesced = 0;  // queued writes replaced by a newer one of the same request
  int64_t dropped = 0;    // writes that found the queue full
  int64_t failed = 0;     // writes the store refused with an I/O error (logged)
  int64_t queued = 0;     // writes waiting now
  int64_t queued_bytes = 0;
  // The most tokens between two written checkpoints of one request (its first: since the
  // start), over every request so far.
  int64_t max_gap_tokens = 0;
};

// Blocks checkpoints hand to the disk tier (engine/checkpoint_blocks.h).
struct CheckpointBlockStats {
  int64_t staged = 0;   // blocks read into the staging
  int64_t handed = 0;   // of those, taken by the disk tier (queued, or found there already)
  int64_t dropped = 0;  // of those, refused by the disk tier (its queue full)
  int64_t deferred = 0; // blocks a checkpoint left for the next one (every slot taken)
};

struct EngineStats {
  bool alive = false;
  int32_t queue_depth = 0;   // submitted, never admitted yet
  int32_t running = 0;       // holding KV blocks
  int32_t waiting = 0;       // queued in the scheduler, preempted ones included
  KvCacheStats kv;           // blocks used / free / cached (pinned)
  KvCacheStats kv_window;    // the sliding-window layers' pool (n_blocks 0: the model has none)
  KvCacheStats kv_quant;     // --kv-quant-start's codec pool (n_blocks 0: none)
  int64_t kv_converted_blocks = 0;  // blocks converted into the codec pool (shared ones not counted)
  StateSnapshotStats state_snapshots;  // recurrent-state snapshots (hybrid families)
  KvTierStats kv_tiers;      // host and disk KV tiers (enabled false: none)
  KvTierStats kv_window_tiers;  // the same for the sliding-window pool's blocks
  KvTierStats state_tiers;      // recurrent-state snapshots on disk (hybrid families)
  int64_t steps = 0;
  int64_t overlapped_steps = 0;   // steps queued while the previous one ran (async scheduling)
  int64_t prompt_tokens = 0;      // of finished requests
  int64_t generated_tokens = 0;   // sampled, all requests
  int64_t prefix_hit_tokens = 0;  // tokens admission took from the prefix cache (recompute too)
  int64_t preemptions = 0;
  int64_t checkpoints_foreign = 0;  // checkpoints skipped: written under another state identity
  CheckpointWriterStats checkpoints;  // written, coalesced, dropped, failed, queued
  CheckpointBlockStats checkpoint_blocks;
  // Speculative decoding: drafted tokens verified, those accepted, verify spans, and verifies
  // by accepted drafts ([i]: i accepted; the last bucket: kMaxSpecHistogram or more).
  static constexpr int kMaxSpecHistogram = 16;
  int64_t spec_draft_tokens = 0;
  int64_t spec_accepted_tokens = 0;
  int64_t spec_verifies = 0;
  int64_t spec_accepted_hist[kMaxSpecHistogram + 1] = {};
  int64_t finished[kNumFinishReasons] = {};  // by FinishReason
  LatencyHistogram ttft = LatencyHistogram::with_default_bounds();         // submit -> first token
  LatencyHistogram inter_token = LatencyHistogram::with_default_bounds();  // between tokens
  // Constrained decoding: the host time of each sampled token's grammar mask (fill and check).
  LatencyHistogram grammar_mask = LatencyHistogram::with_mask_bounds();
  int64_t grammar_requests = 0;  // admitted with a grammar
  int64_t fill_tokens = 0;       // token fill: appended without sampling
  int64_t fill_spans = 0;
};

}  // namespace strata
