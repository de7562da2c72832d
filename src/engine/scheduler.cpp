#include "engine/scheduler.h"

#include <algorithm>
#include <span>

#include "core/check.h"

namespace strata {

Scheduler::Scheduler(SchedulerOptions options, KvCacheManager& kv, std::unique_ptr<SchedulingPolicy> policy)
    : options_(options), kv_(kv), policy_(std::move(policy)) {
  STRATA_CHECK(options_.max_batch_tokens > 0 && options_.max_num_seqs > 0, "scheduler limits must be positive");
  if (!policy_) policy_ = std::make_unique<FcfsPolicy>();
}

void Scheduler::add(Sequence* seq) {
  STRATA_CHECK(seq->n_computed == 0 && seq->blocks.empty() && seq->n_tokens() > 0, "a new sequence holds nothing");
  seq->state = SeqState::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::sort_by_policy(std::vector<Sequence*>& seqs) const {
  std::stable_sort(seqs.begin(), seqs.end(),
                   [this](const Sequence* a, const Sequence* b) { return policy_->before(*a, *b); });
}

int32_t Scheduler::allocate_upto(Sequence* seq, int32_t n_tokens, double now) {
  const int32_t bs = kv_.block_size();
  while (int32_t(seq->blocks.size()) * bs < n_tokens) {
    const int32_t b = kv_.allocate(now);
    if (b < 0) break;
    seq->blocks.push_back(b);
  }
  return std::min(n_tokens, int32_t(seq->blocks.size()) * bs);
}

Sequence* Scheduler::victim_after(const Sequence* seq) const {
  for (size_t j = running_.size(); j-- > 0;) {
    Sequence* cand = running_[j];
    if (cand == seq) return nullptr;
    if (!scheduled_.count(cand)) return cand;
  }
  return nullptr;
}

void Scheduler::preempt(Sequence* seq, double now, StepPlan& plan) {
  kv_.release(seq->blocks, now);
  seq->blocks.clear();
  seq->n_computed = 0;
  seq->n_published = 0;
  seq->state = SeqState::kPreempted;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_back(seq);
  plan.preempted.push_back(seq->id);
  ++n_preemptions_;
}

int32_t Scheduler::grow(Sequence* seq, int32_t n_tokens, double now, StepPlan& plan) {
  for (;;) {
    const int32_t covered = allocate_upto(seq, n_tokens, now);
    if (covered > seq->n_computed) return covered;
    Sequence* victim = victim_after(seq);
    if (!victim) {
      preempt(seq, now, plan);
      return -1;
    }
    preempt(victim, now, plan);
  }
}

void Scheduler::add_span(Sequence* seq, int32_t n_tokens, StepPlan& plan) {
  ScheduledSpan span;
  span.seq = seq;
  span.pos0 = seq->n_computed;
  span.n_tokens = n_tokens;
  span.sample = span.pos0 + n_tokens == seq->n_tokens();
  // Logits at prompt position p give the logprob of prompt token p + 1.
  span.logits_all = seq->prompt_logprobs && seq->prompt_logprob_pos < seq->n_prompt - 1 &&
                    span.pos0 <= seq->prompt_logprob_pos && span.pos0 + n_tokens > seq->prompt_logprob_pos;
  plan.spans.push_back(span);
  plan.n_tokens += n_tokens;
  scheduled_.insert(seq);
}

bool Scheduler::admit(Sequence* seq, int32_t budget, double now, StepPlan& plan) {
  const int32_t bs = kv_.block_size();
  STRATA_CHECK(seq->blocks.empty() && seq->n_computed == 0, "a waiting sequence holds no blocks");
  if (options_.prefix_caching && seq->reuse_prefix) {
    // At least the last token is computed: its logits are what the step is for.
    extend_block_hashes(seq->block_hashes, options_.prefix_salt, seq->tokens, bs);
    const size_t limit = std::min(seq->block_hashes.size(), size_t((seq->n_tokens() - 1) / bs));
    seq->blocks = kv_.acquire_cached(std::span<const uint64_t>(seq->block_hashes).first(limit));
    seq->n_computed = int32_t(seq->blocks.size()) * bs;
    seq->n_published = int32_t(seq->blocks.size());
  }
  const int32_t hit = seq->n_computed;
  const int32_t want = seq->n_computed + std::min(seq->n_remaining(), budget);
  const int32_t reachable = (int32_t(seq->blocks.size()) + kv_.n_available()) * bs;
  const int32_t target = std::min(want, reachable);
  if (target <= seq->n_computed) {
    kv_.release(seq->blocks, now);
    seq->blocks.clear();
    seq->n_computed = 0;
    seq->n_published = 0;
    return false;
  }
  const int32_t covered = allocate_upto(seq, target, now);
  STRATA_CHECK(covered == target, "available blocks could not be allocated");
  if (seq->cached_tokens < 0) seq->cached_tokens = hit;
  prefix_hit_tokens_ += hit;
  seq->state = SeqState::kPrefilling;
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  running_.push_back(seq);
  add_span(seq, target - seq->n_computed, plan);
  return true;
}

StepPlan Scheduler::schedule(double now) {
  StepPlan plan;
  scheduled_.clear();
  int32_t budget = options_.max_batch_tokens;
  sort_by_policy(running_);

  // 1. One token for every decoding sequence, in policy order.
  const std::vector<Sequence*> order = running_;
  for (Sequence* seq : order) {
    if (budget == 0) break;
    if (!seq->running() || seq->n_remaining() != 1) continue;
    if (grow(seq, seq->n_computed + 1, now, plan) < 0) continue;
    add_span(seq, 1, plan);
    budget -= 1;
  }
  // 2. Chunks of partially prefilled sequences.
  for (Sequence* seq : order) {
    if (budget == 0) break;
    if (!seq->running() || scheduled_.count(seq)) continue;
    const int32_t covered = grow(seq, seq->n_computed + std::min(seq->n_remaining(), budget), now, plan);
    if (covered < 0) continue;
    add_span(seq, covered - seq->n_computed, plan);
    budget -= covered - plan.spans.back().pos0;
  }
  // 3. Waiting and preempted sequences, in policy order, while budget, sequences and blocks last.
  sort_by_policy(waiting_);
  while (budget > 0 && !waiting_.empty() && int32_t(running_.size()) < options_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    // One just preempted for lack of blocks would only take them back.
    if (std::find(plan.preempted.begin(), plan.preempted.end(), seq->id) != plan.preempted.end()) break;
    if (!admit(seq, budget, now, plan)) break;
    budget -= plan.spans.back().n_tokens;
  }
  return plan;
}

void Scheduler::commit(const ScheduledSpan& span) {
  Sequence* seq = span.seq;
  STRATA_CHECK(seq->n_computed == span.pos0, "a span is committed once, in order");
  seq->n_computed += span.n_tokens;
  if (span.logits_all) seq->prompt_logprob_pos = std::max(seq->prompt_logprob_pos, std::min(seq->n_computed, seq->n_prompt - 1));
  if (span.sample) seq->state = SeqState::kDecoding;
  const int32_t bs = kv_.block_size();
  const int32_t n_full = seq->n_computed / bs;
  if (!options_.prefix_caching || seq->n_published >= n_full) return;
  extend_block_hashes(seq->block_hashes, options_.prefix_salt,
                      std::span<const int32_t>(seq->tokens).first(size_t(n_full) * size_t(bs)), bs);
  for (int32_t i = seq->n_published; i < n_full; ++i) kv_.publish(seq->blocks[size_t(i)], seq->block_hashes[size_t(i)]);
  seq->n_published = n_full;
}

void Scheduler::finish(Sequence* seq, double now, double pin_until) {
  kv_.release(seq->blocks, now, pin_until);
  seq->blocks.clear();
  seq->state = SeqState::kFinished;
  auto it = std::find(running_.begin(), running_.end(), seq);
  if (it != running_.end()) running_.erase(it);
  it = std::find(waiting_.begin(), waiting_.end(), seq);
  if (it != waiting_.end()) waiting_.erase(it);
}

}  // namespace strata
