#include "engine/scheduler.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <span>

#include "core/check.h"
#include "engine/kv_conversion.h"

namespace strata {

namespace {
constexpr int32_t kNoLimit = std::numeric_limits<int32_t>::max();
}

Scheduler::Scheduler(SchedulerOptions options, KvCacheManager& kv, std::unique_ptr<SchedulingPolicy> policy,
                     KvCacheManager* kv_window, StateSnapshotStore* snapshots)
    : options_(options),
      kv_(kv),
      kv_window_(kv_window),
      snapshots_(snapshots),
      slots_(std::max(options.n_state_slots, 0)),
      policy_(std::move(policy)) {
  STRATA_CHECK(options_.max_batch_tokens > 0 && options_.max_num_seqs > 0, "scheduler limits must be positive");
  STRATA_CHECK((options_.window > 0) == (kv_window_ != nullptr), "a window pool goes with a window, and only then");
  STRATA_CHECK(!kv_window_ || kv_window_->block_size() == kv_.block_size(), "both pools use one block size");
  STRATA_CHECK(options_.n_state_slots <= 0 || options_.n_state_slots >= options_.max_num_seqs,
               "every running sequence needs a state slot");
  STRATA_CHECK(!snapshots_on() || (options_.state_snapshot_interval > 0 &&
                                   options_.state_snapshot_interval % snapshot_align() == 0),
               "snapshots lie on block and chunk boundaries");
  if (!policy_) policy_ = std::make_unique<FcfsPolicy>();
}

void Scheduler::add(Sequence* seq) {
  STRATA_CHECK(seq->n_computed == 0 && seq->blocks.empty() && seq->window_blocks.empty() && seq->state_slot < 0 &&
                   seq->n_tokens() > 0,
               "a new sequence holds nothing");
  seq->state = SeqState::kWaiting;
  waiting_.push_back(seq);
}

void Scheduler::sort_by_policy(std::vector<Sequence*>& seqs) const {
  std::stable_sort(seqs.begin(), seqs.end(),
                   [this](const Sequence* a, const Sequence* b) { return policy_->before(*a, *b); });
}

int32_t Scheduler::covered(const Sequence* seq) const {
  const int32_t bs = kv_.block_size();
  int32_t c = int32_t(seq->blocks.size()) * bs;
  if (kv_window_) c = std::min(c, int32_t(seq->window_blocks.size()) * bs);
  return c;
}

int32_t Scheduler::window_first_block(int32_t pos) const {
  return strata::window_first_block(pos, options_.window, kv_.block_size());
}

bool Scheduler::snapshots_on() const {
  return snapshots_ != nullptr && options_.prefix_caching && options_.n_state_slots > 0;
}

int32_t Scheduler::cut_align() const {
  return options_.n_state_slots > 0 ? std::max(options_.state_chunk, 1) : 1;
}

int32_t Scheduler::snapshot_align() const { return std::lcm(cut_align(), kv_.block_size()); }

bool Scheduler::is_snapshot_point(const Sequence* seq, int32_t pos) const {
  if (!snapshots_on() || pos <= 0) return false;
  // Past the prompt the state comes from decode steps, whose arithmetic a cold prefill of the
  // same tokens does not repeat when prefill is chunked.
  if (cut_align() > 1 && pos > seq->n_prompt) return false;
  const int32_t a = snapshot_align();
  if (pos % options_.state_snapshot_interval == 0) return true;
  // The prompt's end rounded down to a boundary (a next turn extends the prompt), and the last
  // boundary before the prompt's last token (the same prompt again must compute one token).
  return pos == (seq->n_prompt / a) * a || pos == ((seq->n_prompt - 1) / a) * a;
}

int32_t Scheduler::next_snapshot_point(const Sequence* seq, int32_t pos) const {
  if (!snapshots_on()) return kNoLimit;
  const int32_t a = snapshot_align();
  const int64_t every = (int64_t(pos) / options_.state_snapshot_interval + 1) * options_.state_snapshot_interval;
  int32_t next = int32_t(std::min<int64_t>(every, kNoLimit));
  if (cut_align() > 1 && next > seq->n_prompt) next = kNoLimit;
  for (int32_t p : {((seq->n_prompt - 1) / a) * a, (seq->n_prompt / a) * a}) {
    if (p > pos) next = std::min(next, p);
  }
  return next;
}

int32_t Scheduler::aligned_cut(const Sequence* seq, int32_t end) const {
  const int32_t a = cut_align();
  if (a == 1) return end;
  const int32_t done = seq->n_computed;
  if (done >= seq->n_prompt) {
    // A preempted sequence recomputing its generated tokens: they were decoded token by token,
    // so each chunk is cut as one row at its start, then the rest (both run token by token).
    const int32_t next = done % a == 0 ? done + 1 : (done / a + 1) * a;
    return std::min(end, next);
  }
  // The prompt's end is a cut of its own (a preempted sequence recomputes past it).
  if (end >= seq->n_prompt) return seq->n_prompt;
  return std::max(done, end / a * a);
}

int32_t Scheduler::chunk_end(const Sequence* seq, int32_t budget) const {
  const int32_t end = seq->n_computed + std::min(seq->n_remaining(), budget);
  return aligned_cut(seq, std::min(end, next_snapshot_point(seq, seq->n_computed)));
}

int32_t Scheduler::allocate_upto(Sequence* seq, int32_t n_tokens, double now) {
  const int32_t bs = kv_.block_size();
  while (int32_t(seq->blocks.size()) * bs < n_tokens) {
    const int32_t b = kv_.allocate(now);
    if (b < 0) break;
    seq->blocks.push_back(b);
  }
  while (kv_window_ && int32_t(seq->window_blocks.size()) * bs < n_tokens) {
    const int32_t b = kv_window_->allocate(now);
    if (b < 0) break;
    seq->window_blocks.push_back(b);
  }
  return std::min(n_tokens, covered(seq));
}

void Scheduler::release_all(Sequence* seq, double now, double pin_until) {
  if (conversion_) conversion_->release(seq, now, pin_until);  // the codec pool's leading blocks
  kv_.release(seq->blocks, now, pin_until);
  if (kv_window_) {
    kv_window_->release(std::span<const int32_t>(seq->window_blocks).subspan(size_t(seq->window_first)), now, pin_until);
  }
  if (seq->state_slot >= 0) slots_.release(seq->state_slot);
  seq->blocks.clear();
  seq->window_blocks.clear();
  seq->window_first = 0;
  seq->state_slot = -1;
  seq->n_computed = 0;
  seq->n_published = 0;
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
  drop_draft(seq, 0);
  // The recurrent state goes with the slot: recompute restarts from the prefix cache or zero.
  release_all(seq, now, 0.0);
  seq->state = SeqState::kPreempted;
  running_.erase(std::find(running_.begin(), running_.end(), seq));
  waiting_.push_back(seq);
  plan.preempted.push_back(seq->id);
  ++seq->n_preemptions;
  ++n_preemptions_;
}

int32_t Scheduler::grow(Sequence* seq, int32_t n_tokens, double now, StepPlan& plan) {
  for (;;) {
    const int32_t c = aligned_cut(seq, allocate_upto(seq, n_tokens, now));
    if (c > seq->n_computed) return c;
    Sequence* victim = victim_after(seq);
    if (!victim) {
      preempt(seq, now, plan);
      return -1;
    }
    preempt(victim, now, plan);
  }
}

void Scheduler::add_span(Sequence* seq, int32_t n_tokens, StepPlan& plan, bool restore_state, uint64_t restore_hash) {
  ScheduledSpan span;
  span.seq = seq;
  span.pos0 = seq->n_computed;
  span.n_tokens = n_tokens;
  span.sample = span.pos0 + n_tokens == seq->n_tokens();
  // Logits at prompt position p give the logprob of prompt token p + 1.
  span.logits_all = seq->prompt_logprobs && seq->prompt_logprob_pos < seq->n_prompt - 1 &&
                    span.pos0 <= seq->prompt_logprob_pos && span.pos0 + n_tokens > seq->prompt_logprob_pos;
  const int32_t bs = kv_.block_size();
  if (restore_state) {
    STRATA_CHECK(span.pos0 > 0 && span.pos0 % bs == 0, "a state snapshot lies on a block boundary");
    span.restore_state = true;
    span.restore_hash = restore_hash;
  }
  const int32_t end = span.pos0 + n_tokens;
  if (is_snapshot_point(seq, end)) {
    extend_block_hashes(seq->block_hashes, options_.prefix_salt ^ seq->hash_salt,
                        std::span<const int32_t>(seq->tokens).first(size_t(end)), bs);
    span.save_state = true;
    span.save_hash = publish_hash(seq, end / bs - 1);
  }
  plan.spans.push_back(span);
  plan.n_tokens += n_tokens;
  scheduled_.insert(seq);
}

int32_t Scheduler::reusable_blocks(const Sequence* seq, int32_t limit) const {
  const std::span<const uint64_t> hashes(seq->block_hashes);
  int32_t n = kv_.count_cached(hashes.first(size_t(limit)));
  while (n > 0 && !prefix_covered(seq, n, false)) --n;
  return n;
}

bool Scheduler::prefix_covered(const Sequence* seq, int32_t n, bool codec) const {
  if (n <= 0) return true;
  if (options_.n_state_slots > 0 && (!snapshots_on() || !cached_under(seq, n - 1, codec, &Scheduler::snapshot_cached))) {
    return false;
  }
  if (kv_window_) {
    for (int32_t i = window_first_block(n * kv_.block_size()); i < n; ++i) {
      if (!cached_under(seq, i, codec, &Scheduler::window_cached)) return false;
    }
  }
  return true;
}

std::optional<uint64_t> Scheduler::cached_under(const Sequence* seq, int32_t i, bool codec,
                                                bool (Scheduler::*has)(uint64_t) const) const {
  const uint64_t h = seq->block_hashes[size_t(i)];
  if ((this->*has)(h)) return h;
  if (codec) {
    const uint64_t c = conversion_->codec_hash(h);
    if ((this->*has)(c)) return c;
  }
  return std::nullopt;
}

bool Scheduler::window_cached(uint64_t hash) const {
  return kv_window_->count_cached(std::span<const uint64_t>(&hash, 1)) == 1;
}

bool Scheduler::snapshot_cached(uint64_t hash) const { return snapshots_->contains(hash); }

uint64_t Scheduler::publish_hash(const Sequence* seq, int32_t i) const {
  const uint64_t h = seq->block_hashes[size_t(i)];
  return conversion_ != nullptr && !KvConversion::exact_publishable(seq) ? conversion_->codec_hash(h) : h;
}

bool Scheduler::admit(Sequence* seq, int32_t budget, double now, StepPlan& plan) {
  const int32_t bs = kv_.block_size();
  STRATA_CHECK(seq->blocks.empty() && seq->window_blocks.empty() && seq->n_computed == 0 && seq->state_slot < 0,
               "a waiting sequence holds no blocks and no state");
  int32_t hit_blocks = 0;
  if (options_.prefix_caching && seq->reuse_prefix) {
    // At least the last token is computed: its logits are what the step is for.
    extend_block_hashes(seq->block_hashes, options_.prefix_salt ^ seq->hash_salt, seq->tokens, bs);
    const int32_t limit = int32_t(std::min(seq->block_hashes.size(), size_t((seq->n_tokens() - 1) / bs)));
    hit_blocks = reusable_blocks(seq, limit);
    const std::span<const uint64_t> hashes(seq->block_hashes);
    if (conversion_) {
      // Window blocks and snapshots lie at a chain's end only: a codec chain then has no exact tail.
      std::function<bool(int32_t)> covers;
      if (kv_window_ != nullptr || options_.n_state_slots > 0) covers = [&](int32_t n) { return prefix_covered(seq, n, true); };
      hit_blocks = conversion_->acquire_prefix(seq, hit_blocks, limit, covers);
    } else {
      seq->blocks = kv_.acquire_cached(hashes.first(size_t(hit_blocks)));
    }
    STRATA_CHECK(int32_t(seq->blocks.size()) == hit_blocks, "counted blocks could not be acquired");
    if (kv_window_) {
      const int32_t first = window_first_block(hit_blocks * bs);
      seq->window_blocks.assign(size_t(first), -1);
      for (int32_t i = first; i < hit_blocks; ++i) {
        const uint64_t h = cached_under(seq, i, seq->n_quant_blocks > 0, &Scheduler::window_cached).value_or(hashes[size_t(i)]);
        const auto w = kv_window_->acquire_cached(std::span<const uint64_t>(&h, 1));
        STRATA_CHECK(w.size() == 1, "counted window blocks could not be acquired");
        seq->window_blocks.push_back(w[0]);
      }
      seq->window_first = first;
    }
    if (tier_load_ && !kv_window_ && options_.n_state_slots == 0) {
      while (hit_blocks < limit) {
        const uint64_t h = hashes[size_t(hit_blocks)];
        if (kv_.count_cached(hashes.subspan(size_t(hit_blocks), 1)) == 1) {
          seq->blocks.push_back(kv_.acquire_cached(hashes.subspan(size_t(hit_blocks), 1)).at(0));
        } else {
          if (!tier_contains_(h)) break;
          const int32_t b = kv_.allocate(now);
          if (b < 0) break;
          if (!tier_load_(h, b) || !kv_.publish(b, h)) {
            kv_.release(std::span<const int32_t>(&b, 1), now);
            break;
          }
          seq->blocks.push_back(b);
          ++tier_hit_blocks_;
        }
        ++hit_blocks;
      }
    }
    seq->n_computed = hit_blocks * bs;
    seq->n_published = hit_blocks;
  }
  const int32_t hit = seq->n_computed;
  int32_t target = chunk_end(seq, budget);
  target = std::min(target, (int32_t(seq->blocks.size()) + kv_.n_available()) * bs);
  if (kv_window_) target = std::min(target, (int32_t(seq->window_blocks.size()) + kv_window_->n_available()) * bs);
  target = aligned_cut(seq, target);
  if (target <= seq->n_computed) {
    release_all(seq, now, 0.0);
    return false;
  }
  const int32_t c = allocate_upto(seq, target, now);
  STRATA_CHECK(c == target, "available blocks could not be allocated");
  if (options_.n_state_slots > 0) {
    seq->state_slot = slots_.allocate();
    STRATA_CHECK(seq->state_slot >= 0, "a state slot for every running sequence");
  }
  const bool restore = options_.n_state_slots > 0 && hit_blocks > 0;
  uint64_t restore_hash = 0;
  if (restore) {
    restore_hash = cached_under(seq, hit_blocks - 1, seq->n_quant_blocks > 0, &Scheduler::snapshot_cached)
                       .value_or(seq->block_hashes[size_t(hit_blocks - 1)]);
    STRATA_CHECK(snapshots_->find(restore_hash) != nullptr, "the snapshot of a hit");
    snapshots_->note_restore();
  }
  if (seq->cached_tokens < 0) seq->cached_tokens = hit;
  prefix_hit_tokens_ += hit;
  seq->state = SeqState::kPrefilling;
  waiting_.erase(std::find(waiting_.begin(), waiting_.end(), seq));
  running_.push_back(seq);
  add_span(seq, target - seq->n_computed, plan, restore, restore_hash);
  return true;
}

StepPlan Scheduler::schedule(double now) {
  StepPlan plan;
  scheduled_.clear();
  now_ = now;
  int32_t budget = options_.max_batch_tokens;
  sort_by_policy(running_);

  // 1. One token for every decoding sequence, in policy order.
  const std::vector<Sequence*> order = running_;
  for (Sequence* seq : order) {
    if (budget == 0) break;
    if (!seq->running() || seq->n_remaining() != 1 + seq->n_draft) continue;
    if (grow(seq, seq->n_computed + 1, now, plan) < 0) continue;
    add_span(seq, 1, plan);
    budget -= 1;
  }
  // 1b. Drafted tokens of speculating decodes, from what budget and free blocks are left: a
  // draft never preempts anything, and a draft that does not fit is cut.
  for (ScheduledSpan& span : plan.spans) {
    Sequence* seq = span.seq;
    if (seq->n_draft == 0) continue;
    int32_t keep = std::min(seq->n_draft, budget);
    // --kv-quant-start: a decode at position q reads the blocks before q's block in the codec
    // (converted before its step), so a verify reads exactly what those decodes read only while
    // it stays in its pending token's block.
    if (conversion_) keep = std::min(keep, kv_.block_size() - 1 - seq->n_computed % kv_.block_size());
    keep = std::max(0, allocate_upto(seq, seq->n_computed + 1 + keep, now) - seq->n_computed - 1);
    drop_draft(seq, keep);
    span.sample = true;  // the span now reaches the sequence's last token
    if (keep == 0) continue;
    span.n_tokens += keep;
    span.n_draft = keep;
    span.logits_all = true;
    plan.n_tokens += keep;
    budget -= keep;
  }
  // Aligned prefill (cut_align() > 1): the step's first prefill piece may take a whole chunk
  // when less budget is left, so that decodes or a budget below one chunk cannot starve prefill;
  // a step then exceeds max_batch_tokens by less than one chunk.
  bool prefilled = false;
  auto prefill_budget = [&] { return prefilled ? budget : std::max(budget, cut_align()); };
  // 2. Chunks of partially prefilled sequences.
  for (Sequence* seq : order) {
    if (budget == 0) break;
    if (!seq->running() || scheduled_.count(seq)) continue;
    const int32_t target = chunk_end(seq, prefill_budget());
    if (target <= seq->n_computed) continue;  // no aligned cut within the budget: waits
    const int32_t c = grow(seq, target, now, plan);
    if (c < 0) continue;
    add_span(seq, c - seq->n_computed, plan);
    budget = std::max(0, budget - (c - plan.spans.back().pos0));
    prefilled = true;
  }
  // 3. Waiting and preempted sequences, in policy order, while budget, sequences and blocks last.
  sort_by_policy(waiting_);
  while (budget > 0 && !waiting_.empty() && int32_t(running_.size()) < options_.max_num_seqs) {
    Sequence* seq = waiting_.front();
    // One just preempted for lack of blocks would only take them back.
    if (std::find(plan.preempted.begin(), plan.preempted.end(), seq->id) != plan.preempted.end()) break;
    if (!admit(seq, prefill_budget(), now, plan)) break;
    budget = std::max(0, budget - plan.spans.back().n_tokens);
    prefilled = true;
  }
  // Drafts of decodes this step does not run are stale by the next one.
  for (Sequence* seq : running_) {
    if (seq->n_draft > 0 && !scheduled_.count(seq)) drop_draft(seq, 0);
  }
  return plan;
}

void Scheduler::drop_draft(Sequence* seq, int32_t keep) {
  STRATA_CHECK(keep >= 0 && keep <= seq->n_draft, "a draft is only cut");
  seq->tokens.resize(seq->tokens.size() - size_t(seq->n_draft - keep));
  seq->n_draft = keep;
}

void Scheduler::commit(const ScheduledSpan& span) {
  Sequence* seq = span.seq;
  STRATA_CHECK(seq->n_computed == span.pos0, "a span is committed once, in order");
  STRATA_CHECK(span.n_draft == 0, "a verify span is committed with commit_verified");
  seq->n_computed += span.n_tokens;
  if (span.logits_all) seq->prompt_logprob_pos = std::max(seq->prompt_logprob_pos, std::min(seq->n_computed, seq->n_prompt - 1));
  if (span.sample) seq->state = SeqState::kDecoding;
  publish_and_trim(seq);
}

void Scheduler::commit_verified(const ScheduledSpan& span, int32_t n_kept, bool replay) {
  Sequence* seq = span.seq;
  STRATA_CHECK(seq->n_computed == span.pos0, "a span is committed once, in order");
  STRATA_CHECK(n_kept >= 1 && n_kept <= span.n_tokens && seq->n_draft == 0 && seq->n_tokens() == span.pos0 + n_kept,
               "a verify keeps the pending token and a prefix of its draft, the rest already cut");
  seq->n_computed = span.pos0 + n_kept;
  // Paged KV rolls back by forgetting: the rejected positions' rows are overwritten before any
  // query reads them, and blocks wholly past the next token go back to the pool (never published:
  // publication stops at n_computed's full blocks).
  const int32_t bs = kv_.block_size();
  const size_t keep_blocks = size_t((seq->n_computed + 1 + bs - 1) / bs);
  if (replay) seq->n_computed = span.pos0;
  if (seq->blocks.size() > keep_blocks) {
    kv_.release(std::span<const int32_t>(seq->blocks).subspan(keep_blocks), now_);
    seq->blocks.resize(keep_blocks);
  }
  if (kv_window_ && seq->window_blocks.size() > keep_blocks) {
    kv_window_->release(std::span<const int32_t>(seq->window_blocks).subspan(keep_blocks), now_);
    seq->window_blocks.resize(keep_blocks);
  }
  publish_and_trim(seq);
}

void Scheduler::publish_and_trim(Sequence* seq) {
  const int32_t bs = kv_.block_size();
  int32_t n_full = seq->n_computed / bs;
  if (cut_align() > 1) {
    // Only KV of whole prefill chunks: a prompt's last partial chunk and decoded tokens ran the
    // recurrent layers in another order than a longer prompt's prefill of the same tokens does.
    n_full = std::min(n_full, seq->n_prompt / cut_align() * cut_align() / bs);
  }
  if (options_.prefix_caching && seq->n_published < n_full) {
    extend_block_hashes(seq->block_hashes, options_.prefix_salt ^ seq->hash_salt,
                        std::span<const int32_t>(seq->tokens).first(size_t(n_full) * size_t(bs)), bs);
    for (int32_t i = seq->n_published; i < n_full; ++i) {
      const uint64_t h = seq->block_hashes[size_t(i)];
      // A sequence reading converted blocks leaves its window blocks under the codec namespace.
      if (kv_window_ && seq->window_blocks[size_t(i)] >= 0) kv_window_->publish(seq->window_blocks[size_t(i)], publish_hash(seq, i));
      if (i < seq->n_quant_blocks || (conversion_ && !KvConversion::exact_publishable(seq))) continue;
      kv_.publish(seq->blocks[size_t(i)], h);
    }
    seq->n_published = n_full;
  }
  if (kv_window_) {
    // Blocks no later query of this sequence reads go back (published ones stay cached).
    const int32_t first = std::min(window_first_block(seq->n_computed), int32_t(seq->window_blocks.size()));
    for (int32_t i = seq->window_first; i < first; ++i) {
      kv_window_->release(std::span<const int32_t>(&seq->window_blocks[size_t(i)], 1), now_);
      seq->window_blocks[size_t(i)] = -1;
    }
    seq->window_first = std::max(seq->window_first, first);
  }
}

void Scheduler::finish(Sequence* seq, double now, double pin_until) {
  release_all(seq, now, pin_until);
  seq->state = SeqState::kFinished;
  auto it = std::find(running_.begin(), running_.end(), seq);
  if (it != running_.end()) running_.erase(it);
  it = std::find(waiting_.begin(), waiting_.end(), seq);
  if (it != waiting_.end()) waiting_.erase(it);
}

}  // namespace strata
