// Hybrids (gated DeltaNet + attention) through the engine, bit for bit: the delta rule's chunked
// prefill groups absolute positions in blocks of 64, so the scheduler cuts a hybrid's prefill
// only at multiples of 64 and at the prompt's end, and snapshots its state only there. Then
// neither the step budget, nor the batch, nor a prefix hit changes a request's logits: greedy
// ids, sampled logprobs and prompt logprobs equal a one-step prefill's exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "../support/engine_test_support.h"
#include "core/thread_pool.h"
#include "engine/engine.h"

namespace strata {
namespace {

using namespace strata::test;

GenerationRequest request(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  r.logprobs = 5;
  return r;
}

// Bitwise equality of logprob lists (float bits, so -0 and NaN count too).
bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void expect_same_logprobs(const std::vector<TokenLogprobs>& got, const std::vector<TokenLogprobs>& want,
                          const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].chosen.token, want[i].chosen.token) << what << " entry " << i;
    EXPECT_TRUE(same_bits(got[i].chosen.logprob, want[i].chosen.logprob))
        << what << " entry " << i << ": " << got[i].chosen.logprob << " vs " << want[i].chosen.logprob;
    ASSERT_EQ(got[i].top.size(), want[i].top.size()) << what << " entry " << i;
    for (size_t k = 0; k < got[i].top.size(); ++k) {
      EXPECT_EQ(got[i].top[k].token, want[i].top[k].token) << what << " entry " << i << " top " << k;
      EXPECT_TRUE(same_bits(got[i].top[k].logprob, want[i].top[k].logprob)) << what << " entry " << i << " top " << k;
    }
  }
}

class EngineHybridAlign : public ::testing::TestWithParam<const char*> {};

// Prompts of 100, 130 and 200 tokens with prompt logprobs (the logits of every prompt position):
// alone in one-step prefills, then all at once under budgets of 64 and 100 tokens (chunked
// prefill beside decodes) and under a budget below one chunk (a step's first prefill then takes
// a whole chunk): the same bits.
TEST_P(EngineHybridAlign, SmallBudgetsGiveTheLogitsOfOneStepPrefill) {
  const std::string name = GetParam();
  ThreadPool pool(2);
  std::vector<GenerationRequest> reqs;
  int32_t vocab = 0;
  std::map<std::string, Outcome> alone;
  {
    EngineOptions o;
    o.kv_blocks = 128;
    o.max_batch_tokens = 2048;
    o.prefix_caching = false;
    auto e = make_engine(name, pool, o);
    ASSERT_TRUE(e);
    vocab = e->model_config().vocab_size;
    for (int32_t n : {100, 130, 200}) {
      auto r = request("p" + std::to_string(n), random_ids(uint64_t(n), n, vocab), 10);
      r.prompt_logprobs = true;
      reqs.push_back(r);
    }
    for (const auto& r : reqs) {
      alone[r.id] = drain(**e->submit(r));
      ASSERT_EQ(alone[r.id].tokens.size(), 10u) << alone[r.id].final.message;
      ASSERT_EQ(alone[r.id].prompt_logprobs.size(), r.prompt.size() - 1);
    }
  }
  for (int32_t budget : {64, 100, 40}) {
    EngineOptions o;
    o.kv_blocks = 128;
    o.max_batch_tokens = budget;
    o.prefix_caching = false;
    auto e = make_engine(name, pool, o);
    ASSERT_TRUE(e);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& r : reqs) streams.push_back(*e->submit(r));
    for (auto& s : streams) {
      const Outcome out = drain(*s);
      const Outcome& want = alone.at(s->id());
      const std::string what = name + " " + s->id() + " budget " + std::to_string(budget);
      EXPECT_EQ(out.tokens, want.tokens) << what;
      expect_same_logprobs(out.logprobs, want.logprobs, what + " logprobs");
      expect_same_logprobs(out.prompt_logprobs, want.prompt_logprobs, what + " prompt logprobs");
    }
  }
}

// Turn 1, then turn 2 = turn 1's prompt + its answer + more: turn 2 restores the state at turn
// 1's prompt end rounded down to a chunk (150 -> 128) and prefills the rest; a cold engine (no
// prefix caching, another budget) gives it the same greedy ids and the same logprobs, bit for
// bit. The same turn 2 again hits its own snapshot (200 -> 192): the same bits again.
TEST_P(EngineHybridAlign, PrefixHitGivesTheColdRunsBits) {
  const std::string name = GetParam();
  ThreadPool pool(2);
  EngineOptions o;
  o.kv_blocks = 256;
  o.block_size = 16;
  o.max_batch_tokens = 64;
  o.state_snapshot_interval = 64;
  auto warm = make_engine(name, pool, o);
  ASSERT_TRUE(warm);
  const int32_t vocab = warm->model_config().vocab_size;
  auto turn1 = request("t1", random_ids(1, 150, vocab), 20);
  const Outcome out1 = drain(**warm->submit(turn1));
  ASSERT_EQ(out1.tokens.size(), 20u) << out1.final.message;

  auto turn2 = request("t2", turn1.prompt, 24);
  turn2.prompt.insert(turn2.prompt.end(), out1.tokens.begin(), out1.tokens.end());
  const auto extra = random_ids(2, 30, vocab);
  turn2.prompt.insert(turn2.prompt.end(), extra.begin(), extra.end());
  ASSERT_EQ(turn2.prompt.size(), 200u);
  const auto before = warm->stats().state_snapshots;
  const Outcome hit = drain(**warm->submit(turn2));
  EXPECT_EQ(hit.final.usage.cached_tokens, 128) << "turn 1's prompt, 150 tokens, down to its 64-token chunk";
  auto again_req = turn2;
  again_req.id = "t2-again";
  const Outcome again = drain(**warm->submit(again_req));
  EXPECT_EQ(again.final.usage.cached_tokens, 192) << "turn 2's own snapshot at its prompt end (200 -> 192)";
  EXPECT_EQ(warm->stats().state_snapshots.restores - before.restores, 2);

  for (int32_t budget : {2048, 100}) {
    EngineOptions c = o;
    c.prefix_caching = false;
    c.max_batch_tokens = budget;
    auto cold_engine = make_engine(name, pool, c);
    ASSERT_TRUE(cold_engine);
    const Outcome cold = drain(**cold_engine->submit(turn2));
    EXPECT_EQ(cold.final.usage.cached_tokens, 0);
    const std::string what = name + " cold budget " + std::to_string(budget);
    EXPECT_EQ(hit.tokens, cold.tokens) << what;
    EXPECT_EQ(again.tokens, cold.tokens) << what;
    expect_same_logprobs(hit.logprobs, cold.logprobs, what + " vs hit");
    expect_same_logprobs(again.logprobs, cold.logprobs, what + " vs second hit");
  }
}

// A pool too small for the batch preempts sequences; they recompute their prompt in the same
// chunks and their generated tokens token by token, as they were decoded: the logprobs of a
// request equal those it has alone, bit for bit, with and without prefix caching.
TEST_P(EngineHybridAlign, PreemptedSequencesRecomputeTheSameBits) {
  const std::string name = GetParam();
  ThreadPool pool(2);
  std::vector<GenerationRequest> reqs;
  std::map<std::string, Outcome> alone;
  {
    EngineOptions o;
    o.kv_blocks = 256;
    o.prefix_caching = false;
    auto e = make_engine(name, pool, o);
    ASSERT_TRUE(e);
    const int32_t vocab = e->model_config().vocab_size;
    for (int i = 0; i < 10; ++i) reqs.push_back(request("p" + std::to_string(i), random_ids(50 + uint64_t(i), 40 + 17 * i, vocab), 30 + i));
    for (const auto& r : reqs) alone[r.id] = drain(**e->submit(r));
  }
  for (bool prefix : {false, true}) {
    EngineOptions o;
    o.kv_blocks = 20;
    o.block_size = 16;
    o.max_batch_tokens = 100;
    o.prefix_caching = prefix;
    o.state_snapshot_interval = 64;
    auto e = make_engine(name, pool, o, /*start=*/false);  // all queued before the first step
    ASSERT_TRUE(e);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& r : reqs) streams.push_back(*e->submit(r));
    e->start();
    for (auto& s : streams) {
      const Outcome out = drain(*s);
      const std::string what = name + " " + s->id() + " prefix " + std::to_string(prefix);
      EXPECT_EQ(out.tokens, alone.at(s->id()).tokens) << what;
      expect_same_logprobs(out.logprobs, alone.at(s->id()).logprobs, what);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_GT(e->stats().preemptions, 0) << "20 blocks of 16 cannot hold 10 sequences of 70-230 tokens";
  }
}

// A snapshot interval off the 64-token chunk is refused, naming the option and the value.
TEST_P(EngineHybridAlign, RefusesASnapshotIntervalOffTheChunk) {
  ThreadPool pool(1);
  auto m = load_model(model_dir(GetParam()), pool);
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EngineOptions o;
  o.block_size = 16;
  o.state_snapshot_interval = 32;
  auto e = Engine::create(std::move(m).value(), o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("state_snapshot_interval"), std::string::npos) << e.error().message;
  EXPECT_NE(e.error().message.find("32"), std::string::npos) << e.error().message;
  EXPECT_NE(e.error().message.find("64"), std::string::npos) << e.error().message;
}

INSTANTIATE_TEST_SUITE_P(Hybrids, EngineHybridAlign, ::testing::Values("qwen3next-tiny", "qwen35-tiny"),
                         [](const auto& info) {
                           std::string s = info.param;
                           s.erase(std::remove(s.begin(), s.end(), '-'), s.end());
                           return s;
                         });

}  // namespace
}  // namespace strata
