// Scheduler: spends a token budget per step and returns an immutable StepPlan. One token for
// each decoding sequence first, then prefill chunks of partially prefilled and waiting
// sequences in policy order, within max_num_seqs. It hands out block ids (KvCacheManager
// metadata) but never touches KV memory. When blocks run out it preempts the running sequences
// last in policy order (newest first under FCFS): their blocks are released and they recompute
// later, usually from the prefix cache.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_set>
#include <vector>

#include "engine/scheduling_policy.h"
#include "engine/step_plan.h"
#include "kv/kv_cache_manager.h"

namespace strata {

struct SchedulerOptions {
  int32_t max_batch_tokens = 2048;  // tokens per step (decodes + prefill chunks)
  int32_t max_num_seqs = 64;        // running sequences at once
  bool prefix_caching = true;       // off: nothing is looked up or published
  uint64_t prefix_salt = 0;         // namespace of the prefix hashes (prefix_namespace_salt)
};

class Scheduler {
 public:
  Scheduler(SchedulerOptions options, KvCacheManager& kv, std::unique_ptr<SchedulingPolicy> policy);

  // A new sequence (state waiting, nothing computed).
  void add(Sequence* seq);
  StepPlan schedule(double now);
  // The span ran: its tokens now have KV. Publishes the sequence's newly full blocks.
  void commit(const ScheduledSpan& span);
  // Removes a sequence in any state and releases its blocks (pin_until as KvCacheManager::release).
  void finish(Sequence* seq, double now, double pin_until = 0.0);

  const std::vector<Sequence*>& running() const { return running_; }
  const std::vector<Sequence*>& waiting() const { return waiting_; }
  int64_t n_preemptions() const { return n_preemptions_; }
  int64_t prefix_hit_tokens() const { return prefix_hit_tokens_; }
  const SchedulerOptions& options() const { return options_; }

 private:
  // Gives a running `seq` blocks for up to its first `n_tokens` tokens. Returns how many tokens
  // its blocks cover (> n_computed, <= n_tokens). When not one more token fits it preempts the
  // running sequences after it in policy order, last first; when none is left it preempts
  // `seq` itself and returns -1.
  int32_t grow(Sequence* seq, int32_t n_tokens, double now, StepPlan& plan);
  // Allocates blocks while they are available until `n_tokens` are covered; returns the tokens
  // the sequence's blocks cover, at most n_tokens.
  int32_t allocate_upto(Sequence* seq, int32_t n_tokens, double now);
  Sequence* victim_after(const Sequence* seq) const;
  void preempt(Sequence* seq, double now, StepPlan& plan);
  bool admit(Sequence* seq, int32_t budget, double now, StepPlan& plan);
  void add_span(Sequence* seq, int32_t n_tokens, StepPlan& plan);
  void sort_by_policy(std::vector<Sequence*>& seqs) const;

  SchedulerOptions options_;
  KvCacheManager& kv_;
  std::unique_ptr<SchedulingPolicy> policy_;
  std::vector<Sequence*> waiting_;
  std::vector<Sequence*> running_;
  std::unordered_set<const Sequence*> scheduled_;  // this step
  int64_t n_preemptions_ = 0;
  int64_t prefix_hit_tokens_ = 0;
};

}  // namespace strata
