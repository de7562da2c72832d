// Scheduler: token budget, decode first, chunked prefill, policies, max_num_seqs, preemption
// and recompute, prefix hits. Steps are simulated: every planned span is committed and a
// sampled span appends a token, as the engine does after the forward.
#include <gtest/gtest.h>

#include <memory>
#include <numeric>

#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"

namespace strata {
namespace {

constexpr int32_t kBs = 4;

std::unique_ptr<Sequence> make_seq(uint64_t id, int32_t n_prompt, int32_t priority = 0, int32_t first = 0) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->arrival = id;
  s->priority = priority;
  s->tokens.resize(size_t(n_prompt));
  std::iota(s->tokens.begin(), s->tokens.end(), first);
  s->n_prompt = n_prompt;
  return s;
}

// Commits a plan; sampled spans append token 1.
void run(Scheduler& sched, const StepPlan& plan) {
  for (const auto& span : plan.spans) {
    sched.commit(span);
    if (span.sample) span.seq->tokens.push_back(1);
  }
}

struct SpanView {
  uint64_t id;
  int32_t pos0, n;
  bool sample;
  bool operator==(const SpanView&) const = default;
};
std::vector<SpanView> view(const StepPlan& p) {
  std::vector<SpanView> v;
  for (const auto& s : p.spans) v.push_back({s.seq->id, s.pos0, s.n_tokens, s.sample});
  return v;
}
void PrintTo(const SpanView& s, std::ostream* os) {
  *os << "{id " << s.id << " pos0 " << s.pos0 << " n " << s.n << (s.sample ? " sample}" : "}");
}

SchedulerOptions opts(int32_t budget, int32_t max_seqs = 16, bool prefix = true) {
  SchedulerOptions o;
  o.max_batch_tokens = budget;
  o.max_num_seqs = max_seqs;
  o.prefix_caching = prefix;
  o.prefix_salt = prefix_namespace_salt("test");
  return o;
}

TEST(EngineScheduler, BudgetChunksPrefillAndDecodesGoFirst) {
  KvCacheManager kv(64, kBs);
  Scheduler sched(opts(8), kv, std::make_unique<FcfsPolicy>());
  auto a = make_seq(1, 10, 0, 0), b = make_seq(2, 10, 0, 100), c = make_seq(3, 10, 0, 200);
  sched.add(a.get());
  sched.add(b.get());
  sched.add(c.get());

  auto p1 = sched.schedule(0);
  EXPECT_EQ(view(p1), (std::vector<SpanView>{{1, 0, 8, false}}));
  run(sched, p1);
  auto p2 = sched.schedule(0);
  EXPECT_EQ(view(p2), (std::vector<SpanView>{{1, 8, 2, true}, {2, 0, 6, false}}));
  run(sched, p2);
  EXPECT_EQ(a->state, SeqState::kDecoding);
  EXPECT_EQ(b->state, SeqState::kPrefilling);
  auto p3 = sched.schedule(0);
  EXPECT_EQ(view(p3), (std::vector<SpanView>{{1, 10, 1, true}, {2, 6, 4, true}, {3, 0, 3, false}}));
  EXPECT_EQ(p3.n_tokens, 8);
  run(sched, p3);
  auto p4 = sched.schedule(0);
  EXPECT_EQ(view(p4), (std::vector<SpanView>{{1, 11, 1, true}, {2, 10, 1, true}, {3, 3, 6, false}}));
}

TEST(EngineScheduler, PriorityPolicyAdmitsLowerValuesFirstThenArrival) {
  KvCacheManager kv(64, kBs);
  Scheduler sched(opts(4), kv, std::make_unique<PriorityPolicy>());
  auto a = make_seq(1, 4, 5), b = make_seq(2, 4, 1, 100), c = make_seq(3, 4, 1, 200), d = make_seq(4, 4, -2, 300);
  for (auto* s : {a.get(), b.get(), c.get(), d.get()}) sched.add(s);
  std::vector<uint64_t> admitted;
  for (int step = 0; step < 8; ++step) {
    auto p = sched.schedule(0);
    for (const auto& s : p.spans) if (s.pos0 == 0) admitted.push_back(s.seq->id);
    run(sched, p);
  }
  EXPECT_EQ(admitted, (std::vector<uint64_t>{4, 2, 3, 1}));

  KvCacheManager kv2(64, kBs);
  Scheduler fcfs(opts(4), kv2, std::make_unique<FcfsPolicy>());
  auto e = make_seq(1, 4, 5), f = make_seq(2, 4, -9);
  fcfs.add(f.get());
  fcfs.add(e.get());
  EXPECT_EQ(fcfs.schedule(0).spans.at(0).seq->id, 1u);  // arrival order, priority ignored
}

TEST(EngineScheduler, MaxNumSeqsBoundsRunning) {
  KvCacheManager kv(64, kBs);
  Scheduler sched(opts(100, 2), kv, std::make_unique<FcfsPolicy>());
  auto a = make_seq(1, 3), b = make_seq(2, 3, 0, 50), c = make_seq(3, 3, 0, 90);
  for (auto* s : {a.get(), b.get(), c.get()}) sched.add(s);
  auto p = sched.schedule(0);
  EXPECT_EQ(p.spans.size(), 2u);
  run(sched, p);
  EXPECT_EQ(sched.running().size(), 2u);
  sched.finish(a.get(), 1.0);
  auto p2 = sched.schedule(1.0);
  EXPECT_EQ(view(p2), (std::vector<SpanView>{{2, 3, 1, true}, {3, 0, 3, true}}));
}

TEST(EngineScheduler, PreemptsNewestWhenBlocksRunOutAndRecomputes) {
  // 4 blocks of 4 tokens. Two sequences of 8 prompt tokens take 2 blocks each; the first decode
  // at position 8 needs a third block: the newer sequence is preempted.
  KvCacheManager kv(4, kBs);
  Scheduler sched(opts(64), kv, std::make_unique<FcfsPolicy>());
  auto a = make_seq(1, 8, 0, 0), b = make_seq(2, 8, 0, 100);
  sched.add(a.get());
  sched.add(b.get());
  run(sched, sched.schedule(0));  // both prefilled, one token sampled each: 9 tokens
  EXPECT_EQ(kv.stats(0).used, 4);
  auto p = sched.schedule(1);
  // a decodes position 8 and needs a block: b is preempted, its blocks freed.
  EXPECT_EQ(view(p), (std::vector<SpanView>{{1, 8, 1, true}}));
  EXPECT_EQ(p.preempted, (std::vector<uint64_t>{2}));
  EXPECT_EQ(b->state, SeqState::kPreempted);
  EXPECT_EQ(b->n_computed, 0);
  EXPECT_TRUE(b->blocks.empty());
  EXPECT_EQ(sched.n_preemptions(), 1);
  run(sched, p);
  // a's new block was b's evicted tail (released last block first). a finishes; b is readmitted,
  // reuses its still cached first block (positions 0-3) and recomputes the rest, including the
  // token it had sampled.
  sched.finish(a.get(), 2);
  auto r = sched.schedule(2);
  EXPECT_EQ(view(r), (std::vector<SpanView>{{2, 4, 5, true}}));
  EXPECT_EQ(b->cached_tokens, 0);  // usage reports the first admission only
  run(sched, r);
  EXPECT_EQ(b->tokens.size(), 10u);
  sched.finish(b.get(), 3);
  EXPECT_EQ(kv.stats(3).used, 0);
}

TEST(EngineScheduler, OldestDecodesSurviveAndSelfPreemptionWhenNothingNewer) {
  KvCacheManager kv(2, kBs);
  Scheduler sched(opts(64), kv, std::make_unique<FcfsPolicy>());
  auto a = make_seq(1, 4, 0, 0), b = make_seq(2, 3, 0, 100);
  sched.add(a.get());
  sched.add(b.get());
  run(sched, sched.schedule(0));  // a: 5 tokens (1 block computed), b: 4 tokens
  // a needs a second block for position 4 and b holds the last: b goes.
  auto p = sched.schedule(1);
  EXPECT_EQ(view(p), (std::vector<SpanView>{{1, 4, 1, true}}));
  run(sched, p);
  // b cannot come back while a holds both blocks.
  EXPECT_EQ(view(sched.schedule(2)), (std::vector<SpanView>{{1, 5, 1, true}}));
}

TEST(EngineScheduler, PrefixHitSkipsCachedBlocksButNeverTheWholePrompt) {
  KvCacheManager kv(32, kBs);
  Scheduler sched(opts(64), kv, std::make_unique<FcfsPolicy>());
  auto a = make_seq(1, 12);
  sched.add(a.get());
  run(sched, sched.schedule(0));
  sched.finish(a.get(), 1);
  EXPECT_EQ(kv.stats(1).cached, 3);
  // Same 12-token prompt: 2 of its 3 full blocks are reused, the last block is computed.
  auto b = make_seq(2, 12);
  sched.add(b.get());
  auto p = sched.schedule(2);
  EXPECT_EQ(view(p), (std::vector<SpanView>{{2, 8, 4, true}}));
  EXPECT_EQ(b->cached_tokens, 8);
  EXPECT_EQ(sched.prefix_hit_tokens(), 8);
  // Longer prompt with the same first 12 tokens: all three blocks reused.
  auto c = make_seq(3, 14);
  sched.add(c.get());
  auto p2 = sched.schedule(3);
  ASSERT_EQ(p2.spans.size(), 2u);
  EXPECT_EQ(p2.spans[1].seq->id, 3u);
  EXPECT_EQ(p2.spans[1].pos0, 12);
  // Prompt logprobs disable reuse.
  auto d = make_seq(4, 12);
  d->reuse_prefix = false;
  d->prompt_logprobs = true;
  sched.add(d.get());
  auto p3 = sched.schedule(4);
  EXPECT_EQ(p3.spans.back().seq->id, 4u);
  EXPECT_EQ(p3.spans.back().pos0, 0);
  EXPECT_TRUE(p3.spans.back().logits_all);
}

TEST(EngineScheduler, PrefixCachingOffComputesEverything) {
  KvCacheManager kv(32, kBs);
  Scheduler sched(opts(64, 16, false), kv, std::make_unique<FcfsPolicy>());
  auto a = make_seq(1, 12), b = make_seq(2, 12);
  sched.add(a.get());
  run(sched, sched.schedule(0));
  sched.add(b.get());
  auto p = sched.schedule(1);
  EXPECT_EQ(p.spans.back().pos0, 0);
  EXPECT_EQ(b->cached_tokens, 0);
}

TEST(EngineScheduler, WaitingSequenceAdmittedWithTheBlocksLeft) {
  KvCacheManager kv(3, kBs);
  Scheduler sched(opts(64), kv, std::make_unique<FcfsPolicy>());
  auto a = make_seq(1, 20);
  sched.add(a.get());
  auto p = sched.schedule(0);
  EXPECT_EQ(view(p), (std::vector<SpanView>{{1, 0, 12, false}}));  // 3 blocks worth
}

}  // namespace
}  // namespace strata
