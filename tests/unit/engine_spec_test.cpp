// The speculative method without a model: n-gram lookup, the acceptance and step cost models,
// the choice of draft lengths (never below plain decoding's modelled throughput), and the
// scheduler's handling of drafts (cut by budget and free blocks, never preempting; dropped
// when preempted; rolled back with blocks released and nothing rejected published).
#include <gtest/gtest.h>

#include <numeric>
#include <random>

#include "engine/ngram_proposer.h"
#include "engine/scheduler.h"
#include "engine/speculative.h"
#include "kv/kv_cache_manager.h"

namespace strata {
namespace {

TEST(NgramLookup, ProposesWhatFollowedTheLatestLongestMatch) {
  // "1 2 3" occurs at 0 and 5; the suffix "1 2 3" (n = 3) matches latest at 5 -> "9 8".
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 1, 2, 3, 9, 8, 7, 1, 2, 3};
  EXPECT_EQ(ngram_lookup(t, 1, 3, 2), (std::vector<int32_t>{9, 8}));
  EXPECT_EQ(ngram_lookup(t, 1, 3, 4), (std::vector<int32_t>{9, 8, 7, 1}));
  // Only n = 1 allowed: "3" matched latest at index 7 -> 9 8.
  EXPECT_EQ(ngram_lookup(t, 1, 1, 2), (std::vector<int32_t>{9, 8}));
  // The longest suffix wins over a later shorter match: "5 6" vs "6".
  const std::vector<int32_t> u = {5, 6, 10, 11, 7, 6, 20, 5, 6};
  EXPECT_EQ(ngram_lookup(u, 1, 2, 2), (std::vector<int32_t>{10, 11}));
  EXPECT_EQ(ngram_lookup(u, 1, 1, 2), (std::vector<int32_t>{20, 5}));
}

TEST(NgramLookup, RepeatingRunsContinueWithTheirPeriod) {
  const std::vector<int32_t> t = {4, 7, 8, 7, 8};
  EXPECT_EQ(ngram_lookup(t, 1, 3, 5), (std::vector<int32_t>{7, 8, 7, 8, 7}));
  const std::vector<int32_t> same = {3, 3, 3};
  EXPECT_EQ(ngram_lookup(same, 1, 4, 4), (std::vector<int32_t>{3, 3, 3, 3}));
}

TEST(NgramLookup, NoMatchNoDraft) {
  EXPECT_TRUE(ngram_lookup(std::vector<int32_t>{1, 2, 3, 4}, 1, 3, 4).empty());
  EXPECT_TRUE(ngram_lookup(std::vector<int32_t>{1}, 1, 3, 4).empty());
  EXPECT_TRUE(ngram_lookup(std::vector<int32_t>{2, 2}, 1, 3, 0).empty());
  // min_n 2: a match of one token is not enough.
  EXPECT_TRUE(ngram_lookup(std::vector<int32_t>{5, 1, 6, 1}, 2, 3, 2).empty());
}

TEST(AcceptanceStats, FollowsAcceptanceFromItsPrior) {
  AcceptanceStats a;
  EXPECT_DOUBLE_EQ(a.rate(), 0.5);
  EXPECT_DOUBLE_EQ(a.rate(0.1), 0.1);
  AcceptanceStats lucky;
  lucky.observe(1, 1);  // one probe, accepted: weighed against a pool at 0.1
  EXPECT_LT(lucky.rate(0.1), 0.3);
  EXPECT_GT(lucky.rate(0.1), 0.1);
  for (int i = 0; i < 50; ++i) a.observe(4, 4);
  EXPECT_GT(a.rate(), 0.95);
  for (int i = 0; i < 50; ++i) a.observe(4, 0);
  EXPECT_LT(a.rate(0.05), 0.1);
  EXPECT_LT(a.rate(), 0.2);  // ten rejections a step against four tries at 1/2
}

TEST(StepCostModel, FitsFixedAndPerTokenCost) {
  StepCostModel c;
  EXPECT_TRUE(c.empty());
  for (int i = 0; i < 200; ++i) {
    const int32_t n = 1 + (i * 7) % 40;
    c.observe(n, 0.002 + 0.0005 * n);
  }
  EXPECT_NEAR(c.per_token_s(), 0.0005, 0.0001);
  EXPECT_NEAR(c.fixed_s(), 0.002, 0.0004);
  // Steps of one size: the slope leans on its prior and stays within the mean cost per token.
  StepCostModel flat;
  for (int i = 0; i < 100; ++i) flat.observe(8, 0.01);
  EXPECT_GT(flat.per_token_s(), 0.0);
  EXPECT_LE(flat.per_token_s(), 0.01 / 8);
}

TEST(RecentMin, IgnoresAColdCallAndFollowsARisingCost) {
  RecentMin m;
  EXPECT_EQ(m.value(), 0.0);
  m.observe(0.050);  // a first call that captured graphs or caught up on a context
  EXPECT_DOUBLE_EQ(m.value(), 0.050);
  m.observe(0.0016);
  m.observe(0.0019);
  EXPECT_DOUBLE_EQ(m.value(), 0.0016);
  for (size_t i = 0; i < RecentMin::kWindow; ++i) m.observe(0.003);  // more rows draft now
  EXPECT_DOUBLE_EQ(m.value(), 0.003);
  m.observe(-1.0);
  EXPECT_DOUBLE_EQ(m.value(), 0.003);
}

StepCostModel cost_of(double a, double b) {
  StepCostModel c;
  for (int i = 0; i < 400; ++i) {
    const int32_t n = 1 + (i * 13) % 64;
    c.observe(n, a + b * n);
  }
  return c;
}

StepCosts costs_of(double a_plain, double b_plain, double a_verify, double b_verify, double draft_position) {
  StepCosts c;
  c.plain = cost_of(a_plain, b_plain);
  c.verify = cost_of(a_verify, b_verify);
  for (int i = 0; i < 50; ++i) c.draft_position.observe(draft_position);
  return c;
}

// Every k in [0, max_k] per row, by brute force: the best modelled rate.
double best_rate(const std::vector<double>& rates, const std::vector<int32_t>& max_k, const StepCosts& costs) {
  std::vector<int32_t> k(rates.size(), 0);
  double best = 0.0;
  for (;;) {
    best = std::max(best, modelled_step_rate(rates, k, costs));
    size_t i = 0;
    while (i < k.size() && k[i] == max_k[i]) k[i++] = 0;
    if (i == k.size()) return best;
    ++k[i];
  }
}

TEST(ChooseDraftLengths, BestAtTheModelAndNeverBelowPlainDecoding) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 400; ++trial) {
    const size_t n = 1 + rng() % 4;
    // A plain step; a verify regime from none to twice its fixed cost (a line fitted on large
    // verifies can reach below plain(n) at small n); a draft position up to half a step.
    const double a = 0.001 + 0.02 * u(rng), b = 0.05 * u(rng) * a;
    const double av = 2.0 * a * u(rng), bv = b * (1.0 + 2.0 * u(rng)), d = u(rng) < 0.3 ? 0.0 : 0.5 * a * u(rng);
    const StepCosts costs = costs_of(a, b, av, bv, d);
    std::vector<double> rates(n);
    std::vector<int32_t> max_k(n);
    for (size_t i = 0; i < n; ++i) {
      rates[i] = u(rng);
      max_k[i] = int32_t(rng() % 6);
    }
    const auto k = choose_draft_lengths(rates, max_k, std::vector<uint8_t>(n, 0), costs);
    ASSERT_EQ(k.size(), n);
    for (size_t i = 0; i < n; ++i) EXPECT_LE(k[i], max_k[i]);
    const double chosen = modelled_step_rate(rates, k, costs);
    EXPECT_GE(chosen, modelled_step_rate(rates, std::vector<int32_t>(n, 0), costs) * (1 - 1e-12)) << "trial " << trial;
    EXPECT_GE(chosen, best_rate(rates, max_k, costs) * (1 - 1e-9)) << "trial " << trial;
  }
}

TEST(ChooseDraftLengths, FollowsAcceptanceAndCost) {
  std::vector<uint8_t> no(2, 0);
  // Weights dominate, drafts free: extra tokens almost free.
  auto k = choose_draft_lengths(std::vector<double>{0.9, 0.02}, std::vector<int32_t>{8, 8}, no,
                                costs_of(0.01, 0.00001, 0.01, 0.00001, 0.0));
  EXPECT_EQ(k[0], 8);
  EXPECT_LT(k[1], 3);
  // A draft position that costs as much as a step pays only at high acceptance.
  const StepCosts dear = costs_of(0.001, 0.001, 0.001, 0.001, 0.01);
  k = choose_draft_lengths(std::vector<double>{0.3, 0.3}, std::vector<int32_t>{8, 8}, no, dear);
  EXPECT_EQ(k, (std::vector<int32_t>{0, 0}));
  // A verify regime 1.5x a plain step at 64 rows: a 1/4 acceptance does not pay, 0.9 does.
  const StepCosts jump = costs_of(0.006, 0.00001, 0.009, 0.00002, 0.0015);
  const std::vector<int32_t> caps(64, 4);
  const std::vector<uint8_t> none(64, 0);
  k = choose_draft_lengths(std::vector<double>(64, 0.25), caps, none, jump);
  EXPECT_EQ(k, std::vector<int32_t>(64, 0));
  k = choose_draft_lengths(std::vector<double>(64, 0.9), caps, none, jump);
  EXPECT_EQ(k, std::vector<int32_t>(64, 4));
  // The cost of a depth is paid once for all rows: one row at 0.9 among rows at 0.05 drafts
  // deeper than the others.
  std::vector<double> mixed(8, 0.05);
  mixed[3] = 0.9;
  k = choose_draft_lengths(mixed, std::vector<int32_t>(8, 4), std::vector<uint8_t>(8, 0),
                           costs_of(0.004, 0.00001, 0.004, 0.00001, 0.0002));
  EXPECT_EQ(k[3], 4);
  EXPECT_LE(k[0], 1);
  // A probed row drafts one token whatever its rate.
  std::vector<uint8_t> probe = {1, 0};
  k = choose_draft_lengths(std::vector<double>{0.01, 0.01}, std::vector<int32_t>{8, 8}, probe, dear);
  EXPECT_EQ(k, (std::vector<int32_t>{1, 0}));
  // A deeper probe drafts that deep, within the row's cap.
  k = choose_draft_lengths(std::vector<double>{0.01, 0.01}, std::vector<int32_t>{8, 2}, std::vector<uint8_t>{3, 5}, dear);
  EXPECT_EQ(k, (std::vector<int32_t>{3, 2}));
  // Nothing measured yet: the unit model lets a row at the prior rate draft.
  k = choose_draft_lengths(std::vector<double>{0.5}, std::vector<int32_t>{4}, std::vector<uint8_t>{0}, StepCosts{});
  EXPECT_GT(k[0], 0);
}

TEST(ParseSpecMethod, NamesTheFlag) {
  EXPECT_TRUE(parse_spec_method("ngram").ok());
  auto r = parse_spec_method("eagle");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("--speculative"), std::string::npos);
  EXPECT_NE(r.error().message.find("eagle"), std::string::npos);
}

// Scheduler with drafts.
constexpr int32_t kBs = 4;

std::unique_ptr<Sequence> make_seq(uint64_t id, int32_t n_prompt) {
  auto s = std::make_unique<Sequence>();
  s->id = id;
  s->arrival = id;
  s->tokens.resize(size_t(n_prompt));
  std::iota(s->tokens.begin(), s->tokens.end(), 100 * int32_t(id));
  s->n_prompt = n_prompt;
  return s;
}

// Steps (sampled spans append token 7) until every sequence decodes.
void prefill(Scheduler& sched, double now, std::initializer_list<const Sequence*> seqs) {
  auto all_decoding = [&] {
    for (const Sequence* s : seqs) {
      if (s->state != SeqState::kDecoding) return false;
    }
    return true;
  };
  for (int i = 0; i < 16 && !all_decoding(); ++i) {
    StepPlan plan = sched.schedule(now);
    for (const auto& span : plan.spans) {
      sched.commit(span);
      if (span.sample) span.seq->tokens.push_back(7);
    }
  }
}

void add_draft(Sequence& s, std::vector<int32_t> d) {
  s.tokens.insert(s.tokens.end(), d.begin(), d.end());
  s.n_draft = int32_t(d.size());
}

TEST(SchedulerDrafts, DraftsTakeWhatIsLeftAndNeverPreempt) {
  KvCacheManager kv(8, kBs);
  SchedulerOptions o;
  o.max_batch_tokens = 64;
  o.prefix_caching = true;
  Scheduler sched(o, kv, nullptr);
  auto a = make_seq(1, 7), b = make_seq(2, 7);
  sched.add(a.get());
  sched.add(b.get());
  prefill(sched, 0.0, {a.get(), b.get()});
  ASSERT_EQ(a->n_computed, 7);
  ASSERT_EQ(a->state, SeqState::kDecoding);
  // 4 blocks held (2 each, 8 positions); 4 free. a drafts 12 tokens: positions 7..19 need 3 more
  // blocks beyond its 2, b drafts 8: the pool cuts b's draft, nothing is preempted.
  add_draft(*a, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
  add_draft(*b, {1, 2, 3, 4, 5, 6, 7, 8});
  StepPlan plan = sched.schedule(1.0);
  ASSERT_EQ(plan.spans.size(), 2u);
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(plan.spans[0].n_draft, 12);
  EXPECT_EQ(plan.spans[0].n_tokens, 13);
  EXPECT_TRUE(plan.spans[0].logits_all && plan.spans[0].sample);
  // b: its own token fits its second block; one free block is left -> 4 more positions.
  EXPECT_EQ(plan.spans[1].n_draft, 4);
  EXPECT_EQ(b->n_draft, 4);
  EXPECT_EQ(b->n_tokens(), 8 + 4);
  EXPECT_EQ(kv.n_available(), 0);
  // a keeps its pending token and 2 drafts (positions 7, 8, 9): blocks past position 10 go back.
  a->tokens.resize(size_t(7 + 3));
  a->n_draft = 0;
  sched.commit_verified(plan.spans[0], 3);
  EXPECT_EQ(a->n_computed, 10);
  EXPECT_EQ(a->blocks.size(), 3u);  // positions 0..11 cover the next token at 10
  EXPECT_EQ(kv.n_available(), 2);
  // Published: only blocks of kept tokens (2 full blocks of a: positions 0..7).
  EXPECT_EQ(a->n_published, 2);
  b->tokens.resize(size_t(b->n_tokens() - b->n_draft));  // b keeps its pending token only
  b->n_draft = 0;
  sched.commit_verified(plan.spans[1], 1);
  EXPECT_EQ(b->n_computed, 8);
  EXPECT_EQ(b->blocks.size(), 3u);
  EXPECT_EQ(b->n_published, 2);
}

TEST(SchedulerDrafts, BudgetCutsDraftsAndUnscheduledOnesAreDropped) {
  KvCacheManager kv(64, kBs);
  SchedulerOptions o;
  o.max_batch_tokens = 5;
  Scheduler sched(o, kv, nullptr);
  auto a = make_seq(1, 3), b = make_seq(2, 3);
  sched.add(a.get());
  sched.add(b.get());
  prefill(sched, 0.0, {a.get(), b.get()});
  ASSERT_EQ(a->state, SeqState::kDecoding);
  ASSERT_EQ(b->state, SeqState::kDecoding);
  const int32_t b_tokens = b->n_tokens();
  add_draft(*a, {1, 2, 3, 4});
  add_draft(*b, {1, 2, 3, 4});
  StepPlan plan = sched.schedule(1.0);
  // Budget 5: both decodes' own tokens (2), then a's draft takes the 3 left, b's none.
  ASSERT_EQ(plan.spans.size(), 2u);
  EXPECT_EQ(plan.spans[0].n_draft, 3);
  EXPECT_EQ(plan.spans[1].n_draft, 0);
  EXPECT_TRUE(plan.spans[1].sample);
  EXPECT_FALSE(plan.spans[1].logits_all);
  EXPECT_EQ(b->n_draft, 0);
  EXPECT_EQ(b->n_tokens(), b_tokens);
  EXPECT_EQ(plan.n_tokens, 5);

}

TEST(SchedulerDrafts, PreemptionDropsTheVictimsDraft) {
  KvCacheManager kv(4, kBs);
  SchedulerOptions o;
  o.max_batch_tokens = 64;
  Scheduler sched(o, kv, nullptr);
  auto a = make_seq(1, 4), b = make_seq(2, 4);
  sched.add(a.get());
  sched.add(b.get());
  prefill(sched, 0.0, {a.get(), b.get()});
  ASSERT_EQ(a->state, SeqState::kDecoding);
  ASSERT_EQ(b->state, SeqState::kDecoding);
  // Each holds one block and sits at position 4; four decodes take the two free blocks, and
  // then a's next token needs a third block with none free: b (newest) is preempted.
  for (int step = 0; step < 4; ++step) {
    StepPlan p = sched.schedule(1.0 + step);
    for (const auto& span : p.spans) {
      sched.commit(span);
      if (span.sample) span.seq->tokens.push_back(7);
    }
  }
  ASSERT_EQ(a->n_computed, 8);
  add_draft(*b, {1, 2});
  StepPlan plan = sched.schedule(9.0);
  ASSERT_EQ(plan.preempted.size(), 1u);
  EXPECT_EQ(plan.preempted[0], 2u);
  EXPECT_EQ(b->n_draft, 0);
  EXPECT_EQ(b->n_tokens(), 9);
  EXPECT_EQ(b->state, SeqState::kPreempted);
}

}  // namespace
}  // namespace strata
