// The engine thread's state (engine.h): each live request (Active) and everything the thread
// owns (Core). Internal to the engine's .cpp files (engine.cpp, engine_async.cpp).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/checkpoint_blocks.h"
#include "engine/checkpoint_writer.h"
#include "engine/engine.h"
#include "engine/kv_conversion.h"
#include "engine/kv_tier_io.h"
#include "engine/kv_tier_promoter.h"
#include "engine/proposer.h"
#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"
#include "runtime/host/model_runner.h"

namespace strata {

using Clock = std::chrono::steady_clock;

struct Engine::Active {
  Active(PendingRequest p) : req(std::move(p.request)), sampler(std::move(p.sampler)),
                             channel(std::move(p.channel)), submitted(p.submitted),
                             ckpt_key(std::move(p.checkpoint_key)), adapter_slot(p.adapter_slot),
                             adapter_hash(p.adapter_hash) {}
  GenerationRequest req;
  Sampler sampler;
  std::shared_ptr<StreamChannel> channel;
  Clock::time_point submitted, last_token;
  Sequence seq;
  bool in_queue = true;  // counted in the queue depth until first admitted
  std::optional<Clock::time_point> first_scheduled;  // the step that first scheduled it
  bool prompt_logprobs_sent = false;
  std::vector<TokenLogprobs> prompt_lp;
  int32_t n_generated = 0;
  std::string ckpt_key;        // empty: not checkpointed
  uint64_t ckpt_run = 0;       // CheckpointStore run id
  int32_t ckpt_blocks = 0;     // leading blocks already handed to the disk tier
  int32_t shared_blocks = 0;   // leading blocks already handed to the shared (Redis) tier
  // An overlapped step draws the next token's random value before the one in flight is
  // accepted: the RNG from before that draw, for the checkpoint at generation ckpt_rng_gen
  // (the in-flight token's; -1: none), which must not carry a draw of a token it lacks.
  Xoshiro256::State ckpt_rng{};
  int32_t ckpt_rng_gen = -1;
  // Overlapped steps (engine_async.cpp). device_only: every token of the request comes from the
  // executor's device (no penalties or logprobs the executor does not compute). pending_index:
  // the position in seq.tokens of a placeholder whose token is still on the device, produced by
  // row pending_row of the step in flight (-1: none).
  bool device_only = false;
  int32_t pending_index = -1;
  int32_t pending_row = -1;
  // The speculative method (engine_speculative.cpp): on when the engine speculates and the
  // request did not opt out; acceptance drives its draft length; counts go to its usage.
  bool spec_on = false;
  AcceptanceStats spec;
  int32_t spec_drafted = 0;
  int32_t spec_accepted = 0;
  std::vector<float> spec_state;  // recurrent state before the verify in flight (hybrid families)
  // Constrained decoding (engine_grammar.cpp): the sequence's place in its grammar, advanced
  // by every committed token, and the scratch bitmask of the next token. Null: unconstrained.
  std::unique_ptr<grammar::Matcher> matcher;
  bool grammar_wait = false;   // in a reasoning section: the grammar starts after its end
  // Whether the next token is drawn under the grammar (not while it reasons first).
  bool constrained() const { return matcher && !grammar_wait; }
  std::vector<uint32_t> mask;  // [vocab.mask_words()]
  int32_t fill_tokens = 0;     // token fill: forced tokens appended without sampling
  int32_t fill_spans = 0;
  std::vector<float> embedding;  // an embed request's pooled row, handed out by finish()
  int32_t adapter_slot = -1;     // its use of a LoRA slot (released by finish())
  uint64_t adapter_hash = 0;
};

struct Engine::Core {
  Core(Model& model, const KvPlan& plan, const EngineOptions& o, SchedulerOptions so,
       std::unique_ptr<SchedulingPolicy> policy, std::unique_ptr<StepExecutor> executor)
      : kv(plan.pools.n_blocks, o.block_size),
        kv_window(plan.pools.n_window_blocks > 0
                      ? std::make_unique<KvCacheManager>(plan.pools.n_window_blocks, o.block_size)
                      : nullptr),
        snapshots(plan.shape.has_state ? std::make_unique<StateSnapshotStore>(o.state_snapshot_bytes) : nullptr),
        sched(so, kv, std::move(policy), kv_window.get(), snapshots.get()),
        exec(executor ? std::move(executor)
                      : std::make_unique<ModelRunner>(model, plan.layout, plan.pools.n_blocks, o.block_size,
                                                      plan.pools.n_window_blocks, plan.pools.n_state_slots)),
        runner(*exec) {}
  KvCacheManager kv;                             // full-attention layers
  std::unique_ptr<KvCacheManager> kv_window;     // sliding-window layers, when the model has any
  std::unique_ptr<StateSnapshotStore> snapshots; // recurrent-state snapshots, hybrid families
  Scheduler sched;
  std::unique_ptr<StepExecutor> exec;  // the host ModelRunner unless the engine was given one
  StepExecutor& runner;
  std::vector<uint8_t> want_logits;    // per logit row of the step being run
  std::vector<RowSample> row_samples;  // per logit row, when the executor samples on its device
  std::unordered_map<uint64_t, std::unique_ptr<Active>> active;  // by Sequence::id
  uint64_t next_id = 1;
  EngineStats stats;
  std::unique_ptr<KvConversion> conversion;  // --kv-quant-start: the codec pool and the conversion
  // Checkpoints' blocks on their way to the disk tier (checkpoints with a disk tier); before
  // `tiers`, so it outlives the disk writer that gives its slots back.
  std::unique_ptr<CheckpointBlocks> ckpt_io;
  std::unique_ptr<KvTiers> tiers;  // host and disk tiers below `kv`, when configured
  std::vector<uint8_t> tier_buf;   // one block's bytes
  // Blocks the pool evicted whose bytes still go down to the tiers: read together (a device
  // pool: one transfer, StepExecutor::read_blocks) before anything writes the pool again (a
  // step, a promotion's install) or when about kDemoteBatchBytes are waiting.
  static constexpr size_t kDemoteBatchBytes = size_t(64) << 20;
  std::vector<int32_t> demote_blocks;
  std::vector<uint64_t> demote_hashes;
  std::vector<uint8_t> demote_buf;
  void flush_demotions() {
    if (!window_demote_blocks.empty()) {
      // Window blocks are few per sequence: one read, then copies into the tier.
      const size_t wb = size_t(window_tiers->block_bytes());
      demote_buf.resize(window_demote_blocks.size() * wb);
      runner.read_window_blocks(window_demote_blocks, demote_buf.data());
      for (size_t i = 0; i < window_demote_blocks.size(); ++i) window_tiers->demote(window_demote_hashes[i], demote_buf.data() + i * wb);
      window_demote_blocks.clear();
      window_demote_hashes.clear();
    }
    if (demote_blocks.empty()) return;
    demote_to_tiers(*tiers, runner, demote_blocks, demote_hashes, demote_buf);
    demote_blocks.clear();
    demote_hashes.clear();
  }
  // The sliding-window pool's blocks and the recurrent-state snapshots have tiers of their own
  // (host memory and disk for window blocks, disk for snapshots: the snapshot store is their
  // host memory), beside `tiers` and keyed by the same chain hashes; null: none.
  std::unique_ptr<KvTiers> window_tiers;
  std::unique_ptr<KvTiers> state_tiers;
  std::vector<int32_t> window_demote_blocks;
  std::vector<uint64_t> window_demote_hashes;
  bool host_tier_registered = false;  // the host tier's memory is registered with the executor
  ~Core() {
    if (host_tier_registered) runner.unregister_host_memory(tiers->host_memory().data());
  }
  // STRATA_PROFILE_STEPS set: the engine thread's time per pass of its loop by part, logged
  // every 256 steps (Engine::loop); a device executor logs the device's side.
  struct LoopProfile {
    bool on = false;
    int64_t passes = 0, logged_steps = 0;
    double admit_ms = 0, step_ms = 0, checkpoint_ms = 0, pump_ms = 0, max_pass_ms = 0;
  } profile;
  std::unique_ptr<CheckpointStore> checkpoints;  // when checkpoint_every > 0
  std::unique_ptr<CheckpointWriter> ckpt_writer;  // writes `checkpoints` off the engine thread
  // Overlapped scheduling (engine_async.cpp): on when the options, the executor and the
  // engine's features allow it; a step overlaps while no live request is host-bound.
  bool overlap = false;
  int32_t n_host_bound = 0;  // live requests with device_only false
  // The token of one sampled row of the step in flight: the sequence, the row, and where its
  // placeholder sits in seq.tokens (-1: none, the token is appended when it arrives).
  struct InFlightSample {
    uint64_t seq_id = 0;
    int32_t row = 0;
    int32_t index = -1;
  };
  std::optional<std::vector<InFlightSample>> in_flight;  // the step queued and not yet collected
  // The speculative method: the proposer (null: off), the step costs adaptive k reads, the
  // step being timed for them, and per-step scratch.
  std::shared_ptr<Proposer> proposer;
  StepCosts spec_costs;
  AcceptanceStats spec_pool{.decay = 0.995};  // every sequence's acceptance: each one's prior
  std::unordered_map<int32_t, int32_t> draft_calls;  // proposer calls by drafting rows
  struct TimedStep {
    enum Kind { kNone, kPlain, kVerify } kind = kNone;  // plain: decodes only; verify: decodes and drafts
    Clock::time_point start;
    int32_t n_tokens = 0;
    double excluded_s = 0.0;  // of the time from start to the next step's, not this step's own:
                              // drafting, and collecting the step before it
  } timed_step;
  int64_t last_plain_step = 0;  // stats.steps of the latest plain decode step
  std::vector<DraftRow> draft_rows;
  std::vector<std::vector<int32_t>> drafts;
  std::vector<int32_t> verify_tokens;
  std::vector<TokenMask> step_masks;  // an overlapped step's rows' masks (engine_async.cpp)
  // Copies tier hits of new sequences in the background; last, so its thread stops first.
  std::unique_ptr<TierPromoter> promoter;
};

// A constrained row whose mask leaves no id the sampler may draw.
inline constexpr const char* kNoGrammarToken = "the grammar allows no token here (within the sampled vocabulary)";

// Whether a's next token is the argmax of the raw logits (greedy with nothing that reshapes
// the row, no logprobs): an executor may then hand back that token without the logits.
inline bool argmax_only(const GenerationRequest& r, const Sampler& sampler, int32_t vocab) {
  const SamplingParams& p = sampler.params();
  return !r.embed && r.logprobs < 0 && r.grammar == nullptr && p.greedy() && p.logit_bias.empty() && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && (p.vocab_limit <= 0 || p.vocab_limit >= vocab);
}

}  // namespace strata
