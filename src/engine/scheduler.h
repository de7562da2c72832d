// Scheduler: spends a token budget per step and returns an immutable StepPlan. One token for
// each decoding sequence first, then prefill chunks of partially prefilled and waiting
// sequences in policy order, within max_num_seqs. It hands out block ids (KvCacheManager
// metadata) but never touches KV memory. When blocks run out it preempts the running sequences
// last in policy order (newest first under FCFS): their blocks are released and they recompute
// later, usually from the prefix cache.
//
// Speculating sequences (Sequence::n_draft > 0) bring drafted tokens after their pending one:
// their decode span takes the draft from the budget and free blocks left after every decode's
// own token (a draft never preempts), cut to what fits; commit_verified rolls back the rest.
//
// Sliding-window layers (options.window > 0) page in a pool of their own (kv_window): a
// sequence's window_blocks behind the window of its next query go back to that pool at commit,
// so a long sequence holds full KV only for its full-attention layers. A cached prefix is
// reused up to a block boundary P only where both pools still hold what a query at P reads:
// every block of [0, P) in the full pool and the blocks of [P - window + 1, P) in the window pool.
//
// Hybrid families (options.n_state_slots > 0) give each running sequence a recurrent-state slot.
// With prefix caching, a span that ends at a snapshot boundary (every state_snapshot_interval
// tokens, and the last block boundary at or before the prompt's end, and before its last token)
// asks for a snapshot; prefill chunks are cut at those boundaries. A prefix is reused only up to
// a position whose snapshot is held; admission then asks the runner to restore it.
//
// With options.state_chunk > 1 (gated DeltaNet: its prefill arithmetic groups absolute positions
// in blocks of 64) a prefill span ends only at a multiple of state_chunk or at the prompt's end
// (or the sequence's): a step whose budget or blocks hold no such cut leaves the sequence
// waiting, but the step's first prefill piece may take a whole chunk when less budget is left
// (after decodes, or under a budget below one chunk): a step can exceed max_batch_tokens by less
// than state_chunk tokens, and prefill always progresses. Snapshot boundaries then round to
// lcm(state_chunk, block size) and lie inside the prompt, so a restored state sits on a chunk
// boundary computed by prefill, and a prefix hit covers every later block as a cold run does:
// the same bits. Only blocks inside the prompt's whole chunks are published (the KV of a
// partial last chunk or of decoded tokens is not what a longer prompt's prefill computes).
// Generated tokens a preempted sequence recomputes are cut so that the recurrent layers run them
// token by token, as they were decoded.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_set>
#include <vector>

#include "engine/scheduling_policy.h"
#include "kv/kv_cache_manager.h"
#include "kv/kv_plan.h"
#include "kv/state_cache.h"
#include "runtime/step_plan.h"

namespace strata {

// max_batch_tokens and max_num_seqs: StepLimits (kv/kv_plan.h).
struct SchedulerOptions : StepLimits {
  bool prefix_caching = true;       // off: nothing is looked up or published
  uint64_t prefix_salt = 0;         // namespace of the prefix hashes (prefix_namespace_salt)
  int32_t window = 0;               // > 0: tokens the sliding-window layers read (their largest window)
  int32_t n_state_slots = 0;        // > 0: recurrent-state slots (>= max_num_seqs)
  int32_t state_snapshot_interval = 512;  // tokens between state snapshots, a multiple of the block size
                                          // and of state_chunk
  // > 1 (with n_state_slots): prefill is cut at multiples of it or the prompt's end, generated
  // tokens recomputed after preemption one row after a multiple and at the next (the recurrent
  // layers run a piece of fewer than 16 rows at a chunk's start, or any from mid-chunk, token by
  // token: see cpu::gated_delta_rule).
  int32_t state_chunk = 0;
};

class KvConversion;

// The first block a sliding-window layer's query at position `pos` reads (keys p > pos - window):
// a prefix hit of pos tokens needs the window pool's blocks from there to its end.
inline int32_t window_first_block(int32_t pos, int32_t window, int32_t block_size) {
  return (pos - window + 1 > 0 ? pos - window + 1 : 0) / block_size;
}

class Scheduler {
 public:
  // kv: the full-attention layers' pool. kv_window: the sliding-window layers' pool (required
  // when options.window > 0). snapshots: where recurrent-state snapshots live (null: none are
  // taken or restored).
  Scheduler(SchedulerOptions options, KvCacheManager& kv, std::unique_ptr<SchedulingPolicy> policy,
            KvCacheManager* kv_window = nullptr, StateSnapshotStore* snapshots = nullptr);

  // A new sequence (state waiting, nothing computed).
  void add(Sequence* seq);
  StepPlan schedule(double now);
  // The span ran: its tokens now have KV. Publishes the sequence's newly full blocks.
  void commit(const ScheduledSpan& span);
  // A verify span (n_draft > 0) ran and its first n_kept tokens (the pending token and the
  // accepted drafts) are kept: the caller has cut seq->tokens to pos0 + n_kept. n_computed
  // rolls back to there and blocks past the next token are released.
  // replay (recurrent state): the caller restored the state from before the span, so
  // n_computed rolls back to pos0 and the kept tokens run again (their KV rows are rewritten
  // with the same bits); blocks for them stay.
  void commit_verified(const ScheduledSpan& span, int32_t n_kept, bool replay = false);
  // Removes a sequence in any state and releases its blocks (pin_until as KvCacheManager::release).
  void finish(Sequence* seq, double now, double pin_until = 0.0);

  // Lower KV tiers (host memory, disk) below the full-attention pool. Admission continues a
  // prefix hit past the device index while the device or `contains` has the next hash: a tier
  // block is copied into a freshly allocated pool block by `load` (during planning, so before
  // the step that reads it) and published. Used only without a window pool and recurrent state.
  void set_lower_tiers(std::function<bool(uint64_t hash)> contains,
                       std::function<bool(uint64_t hash, int32_t block)> load) {
    tier_contains_ = std::move(contains);
    tier_load_ = std::move(load);
  }
  int64_t tier_hit_blocks() const { return tier_hit_blocks_; }
  // --kv-quant-start: a sequence's leading blocks may live in the conversion's codec pool
  // (engine/kv_conversion.h); admission takes prefix hits from either pool, releases free both,
  // and exact blocks are published only while their sequence reads nothing converted.
  void set_kv_conversion(KvConversion* conversion) { conversion_ = conversion; }

  const std::vector<Sequence*>& running() const { return running_; }
  const std::vector<Sequence*>& waiting() const { return waiting_; }
  int64_t n_preemptions() const { return n_preemptions_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  const SchedulerOptions& options() const { return options_; }
  const StateSlotPool& state_slots() const { return slots_; }

 private:
  // Gives a running `seq` blocks for up to its first `n_tokens` tokens. Returns how many tokens
  // its blocks cover, down to an aligned cut (> n_computed, <= n_tokens). When no cut fits it preempts the
  // running sequences after it in policy order, last first; when none is left it preempts
  // `seq` itself and returns -1.
  int32_t grow(Sequence* seq, int32_t n_tokens, double now, StepPlan& plan);
  // Allocates blocks while they are available until `n_tokens` are covered; returns the tokens
  // the sequence's blocks cover, at most n_tokens.
  int32_t allocate_upto(Sequence* seq, int32_t n_tokens, double now);
  // Tokens both pools' blocks of `seq` cover.
  int32_t covered(const Sequence* seq) const;
  // First block of the window pool a query at `pos` or later reads.
  int32_t window_first_block(int32_t pos) const;
  bool snapshots_on() const;
  bool is_snapshot_point(const Sequence* seq, int32_t pos) const;
  // The first snapshot boundary after `pos` (INT32_MAX when none are taken).
  int32_t next_snapshot_point(const Sequence* seq, int32_t pos) const;
  // End of the next prefill chunk of `seq` within `budget` tokens (seq->n_computed: none fits).
  int32_t chunk_end(const Sequence* seq, int32_t budget) const;
  // Multiple prefill cuts must be of (1: any position), and snapshots of.
  int32_t cut_align() const;
  int32_t snapshot_align() const;
  // The last position at or before `end` where a span of `seq` may end (seq->n_computed: none).
  int32_t aligned_cut(const Sequence* seq, int32_t end) const;
  // Leading blocks of seq->block_hashes[0, limit) both pools (and a state snapshot) can serve.
  int32_t reusable_blocks(const Sequence* seq, int32_t limit) const;
  // Whether a sequence starting from its chain's first n blocks finds what its other layers
  // read there: the window blocks of [window_first_block(n * bs), n) and a state snapshot at
  // block n. codec: the chain is the codec pool's (--kv-quant-start), whose sequences left
  // window blocks and snapshots under the exact namespace before they read converted blocks
  // and under the codec namespace after; either serves.
  bool prefix_covered(const Sequence* seq, int32_t n, bool codec) const;
  // The hash block i's window block or snapshot (`has`: window_cached, snapshot_cached) is
  // cached under: the exact namespace's, else for a codec chain (codec) the codec namespace's;
  // none when neither holds it.
  std::optional<uint64_t> cached_under(const Sequence* seq, int32_t i, bool codec,
                                       bool (Scheduler::*has)(uint64_t) const) const;
  bool window_cached(uint64_t hash) const;
  bool snapshot_cached(uint64_t hash) const;
  // Hash a window block or snapshot a sequence leaves at block i goes under: the codec
  // namespace's once it reads converted blocks.
  uint64_t publish_hash(const Sequence* seq, int32_t i) const;
  // Releases every block and the state slot of `seq` and forgets its progress.
  void release_all(Sequence* seq, double now, double pin_until);
  Sequence* victim_after(const Sequence* seq) const;
  void preempt(Sequence* seq, double now, StepPlan& plan);
  bool admit(Sequence* seq, int32_t budget, double now, StepPlan& plan);
  // restore_hash: the snapshot a restoring span loads (its chain's block before pos0).
  void add_span(Sequence* seq, int32_t n_tokens, StepPlan& plan, bool restore_state = false, uint64_t restore_hash = 0);
  void sort_by_policy(std::vector<Sequence*>& seqs) const;
  // Cuts seq's draft to its first `keep` tokens.
  void drop_draft(Sequence* seq, int32_t keep);
  // After n_computed advanced: publishes newly full blocks, releases window blocks behind.
  void publish_and_trim(Sequence* seq);

  SchedulerOptions options_;
  KvCacheManager& kv_;
  KvCacheManager* kv_window_;
  StateSnapshotStore* snapshots_;
  StateSlotPool slots_;
  std::unique_ptr<SchedulingPolicy> policy_;
  std::vector<Sequence*> waiting_;
  std::vector<Sequence*> running_;
  std::unordered_set<const Sequence*> scheduled_;  // this step
  double now_ = 0.0;  // engine clock (s) of the last schedule(), which commit() follows
  int64_t n_preemptions_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  std::function<bool(uint64_t)> tier_contains_;
  std::function<bool(uint64_t, int32_t)> tier_load_;
  int64_t tier_hit_blocks_ = 0;
  KvConversion* conversion_ = nullptr;
};

}  // namespace strata
