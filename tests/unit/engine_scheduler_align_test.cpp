// The scheduler's cuts for hybrid sequences (state_chunk 64): prefill ends only at multiples of
// 64 or at the prompt's end, a budget without such a cut leaves the sequence waiting (but the
// step's first prefill may take a whole chunk), snapshots lie on chunk boundaries inside the
// prompt, and generated tokens recomputed after preemption are cut one row past a chunk start
// and at the next chunk start.
#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "engine/scheduler.h"
#include "kv/kv_cache_manager.h"
#include "kv/prefix_index.h"
#include "kv/state_cache.h"

namespace strata {
namespace {

using Spans = std::vector<std::pair<int32_t, int32_t>>;  // (pos0, end)

SchedulerOptions hybrid_options(int32_t budget, bool prefix) {
  SchedulerOptions so;
  so.max_batch_tokens = budget;
  so.max_num_seqs = 4;
  so.prefix_caching = prefix;
  so.prefix_salt = prefix_namespace_salt("align");
  so.n_state_slots = 4;
  so.state_snapshot_interval = 64;
  so.state_chunk = 64;
  return so;
}

Sequence make_seq(uint64_t id, int32_t n_prompt, int32_t n_tokens) {
  Sequence s;
  s.id = id;
  s.tokens.resize(size_t(n_tokens));
  for (int32_t i = 0; i < n_tokens; ++i) s.tokens[size_t(i)] = 3 + (i * 7 + int32_t(id)) % 50;
  s.n_prompt = n_prompt;
  return s;
}

// Schedules `seq` alone until it has computed every token; returns its spans and the ends that
// asked for a snapshot.
std::pair<Spans, std::vector<int32_t>> run_alone(Scheduler& sched, Sequence& seq) {
  Spans spans;
  std::vector<int32_t> saves;
  for (int step = 0; step < 100 && seq.n_computed < seq.n_tokens(); ++step) {
    auto plan = sched.schedule(0.0);
    EXPECT_EQ(plan.spans.size(), 1u);
    if (plan.spans.empty()) break;
    const auto& sp = plan.spans[0];
    spans.emplace_back(sp.pos0, sp.pos0 + sp.n_tokens);
    if (sp.save_state) saves.push_back(sp.pos0 + sp.n_tokens);
    sched.commit(sp);
  }
  return {spans, saves};
}

TEST(SchedulerAlign, PrefillEndsOnChunksOrThePromptEnd) {
  KvCacheManager kv(64, 16);
  Scheduler sched(hybrid_options(100, false), kv, std::make_unique<FcfsPolicy>());
  Sequence a = make_seq(1, 200, 200);
  sched.add(&a);
  // A budget of 100 rounds down to 64, then to 128; the prompt's end needs only 72.
  EXPECT_EQ(run_alone(sched, a).first, (Spans{{0, 64}, {64, 128}, {128, 200}}));
  sched.finish(&a, 0.0);
}

TEST(SchedulerAlign, SnapshotsOnChunksInsideThePromptOnly) {
  KvCacheManager kv(64, 16);
  StateSnapshotStore snaps(1 << 20);
  Scheduler sched(hybrid_options(2048, true), kv, std::make_unique<FcfsPolicy>(), nullptr, &snaps);
  Sequence a = make_seq(1, 150, 150);
  sched.add(&a);
  auto [spans, saves] = run_alone(sched, a);
  // 150 rounds down to 128 (a block boundary of 16 would have been 144).
  EXPECT_EQ(spans, (Spans{{0, 64}, {64, 128}, {128, 150}}));
  EXPECT_EQ(saves, (std::vector<int32_t>{64, 128}));
  // Decoding past 192 takes no snapshot: a decoded state is not what a cold prefill computes.
  for (int32_t t = 150; t < 200; ++t) {
    a.tokens.push_back(5);
    auto plan = sched.schedule(0.0);
    ASSERT_EQ(plan.spans.size(), 1u);
    EXPECT_FALSE(plan.spans[0].save_state) << "decode to " << plan.spans[0].pos0 + 1;
    sched.commit(plan.spans[0]);
  }
  sched.finish(&a, 0.0);
}

TEST(SchedulerAlign, ABudgetWithoutAChunkWaitsUnlessThePromptEnds) {
  KvCacheManager kv(64, 16);
  Scheduler sched(hybrid_options(100, false), kv, std::make_unique<FcfsPolicy>());
  Sequence d = make_seq(1, 10, 10);  // decodes from the second step on
  sched.add(&d);
  auto plan = sched.schedule(0.0);
  ASSERT_EQ(plan.spans.size(), 1u);
  sched.commit(plan.spans[0]);
  d.tokens.push_back(5);
  Sequence a = make_seq(2, 100, 100), b = make_seq(3, 30, 30), c = make_seq(4, 100, 100);
  sched.add(&a);
  sched.add(&b);
  sched.add(&c);
  plan = sched.schedule(0.0);
  // 99 left after the decode: a takes 64 (99 is no cut), b its whole 30-token prompt inside the
  // 35 left, and c no cut of its prompt fits in 5: it waits.
  ASSERT_EQ(plan.spans.size(), 3u);
  EXPECT_EQ(plan.spans[1].seq, &a);
  EXPECT_EQ(plan.spans[1].n_tokens, 64);
  EXPECT_EQ(plan.spans[2].seq, &b);
  EXPECT_EQ(plan.spans[2].n_tokens, 30);
  EXPECT_EQ(plan.n_tokens, 95);
  for (Sequence* s : {&a, &b, &c, &d}) sched.finish(s, 0.0);
}

TEST(SchedulerAlign, TheFirstPrefillTakesAChunkUnderASmallBudget) {
  KvCacheManager kv(64, 16);
  Scheduler sched(hybrid_options(40, false), kv, std::make_unique<FcfsPolicy>());
  Sequence d = make_seq(1, 10, 10);
  sched.add(&d);
  auto plan = sched.schedule(0.0);
  ASSERT_EQ(plan.spans.size(), 1u);
  sched.commit(plan.spans[0]);
  d.tokens.push_back(5);
  Sequence a = make_seq(2, 100, 100);
  sched.add(&a);
  // A budget of 40 holds no chunk: the step's first prefill takes one anyway (65 tokens with the
  // decode), the next step the prompt's last 36.
  plan = sched.schedule(0.0);
  ASSERT_EQ(plan.spans.size(), 2u);
  EXPECT_EQ(plan.spans[1].n_tokens, 64);
  for (const auto& sp : plan.spans) sched.commit(sp);
  d.tokens.push_back(5);
  plan = sched.schedule(0.0);
  ASSERT_EQ(plan.spans.size(), 2u);
  EXPECT_EQ(plan.spans[1].seq, &a);
  EXPECT_EQ(plan.spans[1].pos0, 64);
  EXPECT_EQ(plan.spans[1].n_tokens, 36);
  sched.finish(&a, 0.0);
  sched.finish(&d, 0.0);
}

TEST(SchedulerAlign, RecomputedGeneratedTokensAreCutForTheRecurrentForm) {
  KvCacheManager kv(64, 16);
  Scheduler sched(hybrid_options(2048, false), kv, std::make_unique<FcfsPolicy>());
  Sequence a = make_seq(1, 70, 140);  // as after preemption: 70 prompt and 70 generated tokens
  sched.add(&a);
  EXPECT_EQ(run_alone(sched, a).first, (Spans{{0, 70}, {70, 128}, {128, 129}, {129, 140}}));
  sched.finish(&a, 0.0);
}

}  // namespace
}  // namespace strata
