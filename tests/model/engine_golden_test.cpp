// Every reference model through the batched engine (f32): several requests at once, a small
// step budget forcing chunked prefill and mixed steps, small blocks so sliding windows give
// blocks back and hybrids snapshot their state often. Greedy ids equal the oracle's exactly;
// prompt argmax (through prompt logprobs, top-1) too. A second wave of the same prompts is
// served from the prefix cache (windows' blocks and state snapshots included) with the same
// tokens. Hybrids: a conversation's next turn restores the state and matches a cold engine,
// and preemption recomputes. Gemma: a long sequence holds fewer sliding blocks than full ones.
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "../support/engine_test_support.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "golden_cases.h"
#include "model/registry.h"

namespace strata {
namespace {

using namespace strata::test;

struct RefModel {
  const char* name;  // key in logits.json
  const char* dir;   // relative to the repository root
  bool attn_softcap = true;  // false: the oracle ran without Gemma 2's attention soft-cap
};

const RefModel kModels[] = {
    {"stories260k", "tests/data/reference/models/stories260k"},
    {"llama3-tiny", "tests/data/reference/models/llama3-tiny"},
    {"mistral-tiny", "tests/data/reference/models/mistral-tiny"},
    {"qwen2-tiny", "tests/data/reference/models/qwen2-tiny"},
    {"qwen3-tiny", "tests/data/reference/models/qwen3-tiny"},
    {"qwen3yarn-tiny", "tests/data/reference/models/qwen3yarn-tiny"},
    {"qwen3moe-tiny", "tests/data/reference/models/qwen3moe-tiny"},
    {"gemma2-tiny", "tests/data/reference/models/gemma2-tiny", /*attn_softcap=*/false},
    {"gemma3-tiny", "tests/data/reference/models/gemma3-tiny"},
    {"gemma3mm-tiny", "tests/data/reference/models/gemma3mm-tiny"},
    {"gemma4-tiny", "tests/data/reference/models/gemma4-tiny"},
    {"gemma4moe-tiny", "tests/data/reference/models/gemma4moe-tiny"},
    {"qwen3next-tiny", "tests/data/reference/models/qwen3next-tiny"},
    {"qwen35-tiny", "tests/data/reference/models/qwen35-tiny"},
    {"qwen35moe-tiny", "tests/data/reference/models/qwen35moe-tiny"},
    {"strata-demo", "models/strata-demo"},
    {"strata-demo-draft", "models/strata-demo-draft"},
};

std::string path_of(const char* dir) { return std::string(STRATA_SOURCE_DIR) + "/" + dir; }

std::unique_ptr<Model> load(const RefModel& m, ThreadPool& pool) {
  LoadOptions lo;
  lo.attn_softcap = m.attn_softcap;
  auto r = load_model(path_of(m.dir), pool, lo);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return r.ok() ? std::move(r).value() : nullptr;
}

GenerationRequest greedy(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  return r;
}

constexpr int32_t kBlock = 4;

EngineOptions golden_options() {
  EngineOptions o;
  o.kv_blocks = 512;
  o.block_size = kBlock;
  o.max_batch_tokens = 24;  // prompts of 33 and 100 tokens prefill in chunks beside decodes
  o.state_snapshot_interval = 64;  // hybrids: a multiple of the delta rule's 64-token chunk
  return o;
}

class EngineGolden : public ::testing::TestWithParam<RefModel> {};

TEST_P(EngineGolden, GreedyAndPromptArgmaxMatchTheOracleInMixedBatches) {
  const RefModel& rm = GetParam();
  ThreadPool pool(2);
  auto engine = start_engine(load(rm, pool), golden_options(), rm.name);
  ASSERT_TRUE(engine);
  const std::string name = rm.name;

  struct Expect {
    std::vector<int32_t> prompt, greedy_ids, prompt_argmax;
  };
  std::vector<Expect> cases;
  if (name == "stories260k") {
    const auto ref = golden::logits_json()["stories260k"]["greedy_from_bos_ids"].get<std::vector<int32_t>>();
    ASSERT_EQ(ref.size(), 257u);
    cases.push_back({{ref[0]}, std::vector<int32_t>(ref.begin() + 1, ref.end()), {}});
  } else {
    for (const auto& c : golden::cases_for(name)) cases.push_back({c.prompt_ids, c.greedy_ids, c.prompt_argmax});
  }
  ASSERT_FALSE(cases.empty());

  // Wave 1: every case twice at once, once with prompt logprobs (which never reuse a prefix).
  std::vector<std::shared_ptr<RequestStream>> plain, echoed;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto r = greedy("c" + std::to_string(i), cases[i].prompt, int32_t(cases[i].greedy_ids.size()));
    auto s = engine->submit(r);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    plain.push_back(*s);
    if (cases[i].prompt_argmax.empty()) continue;
    r.id += "-echo";
    r.prompt_logprobs = true;
    r.logprobs = 1;
    auto e = engine->submit(r);
    ASSERT_TRUE(e.ok()) << e.error().to_string();
    echoed.push_back(*e);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_EQ(drain(*plain[i]).tokens, cases[i].greedy_ids) << name << " case " << i;
  }
  for (size_t i = 0, k = 0; i < cases.size(); ++i) {
    if (cases[i].prompt_argmax.empty()) continue;
    auto out = drain(*echoed[k++]);
    EXPECT_EQ(out.tokens, cases[i].greedy_ids) << name << " case " << i << " (prompt logprobs)";
    // Entry p scores prompt token p + 1 from the logits at position p: its top-1 is that argmax.
    ASSERT_EQ(out.prompt_logprobs.size(), cases[i].prompt.size() - 1) << name << " case " << i;
    for (size_t p = 0; p + 1 < cases[i].prompt.size(); ++p) {
      ASSERT_FALSE(out.prompt_logprobs[p].top.empty());
      EXPECT_EQ(out.prompt_logprobs[p].top[0].token, cases[i].prompt_argmax[p]) << name << " case " << i << " position " << p;
    }
  }

  // Wave 2: the same prompts again, served from the prefix cache up to the last block boundary
  // before their last token: attention blocks, window blocks and state snapshots alike.
  std::vector<std::shared_ptr<RequestStream>> again;
  for (size_t i = 0; i < cases.size(); ++i) {
    auto s = engine->submit(greedy("again" + std::to_string(i), cases[i].prompt, int32_t(cases[i].greedy_ids.size())));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    again.push_back(*s);
  }
  for (size_t i = 0; i < cases.size(); ++i) {
    auto out = drain(*again[i]);
    EXPECT_EQ(out.tokens, cases[i].greedy_ids) << name << " case " << i << " from the prefix cache";
    const int32_t n = int32_t(cases[i].prompt.size());
    // Hybrids restore state only at multiples of their 64-token prefill chunk.
    const int32_t align = engine->stats().state_snapshots.stores > 0 ? 64 : kBlock;
    EXPECT_EQ(out.final.usage.cached_tokens, (n - 1) / align * align) << name << " case " << i;
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const auto st = engine->stats();
  EXPECT_EQ(st.kv.used, 0);
  EXPECT_EQ(st.kv_window.used, 0);
  EXPECT_EQ(st.running + st.waiting + st.queue_depth, 0);
}

INSTANTIATE_TEST_SUITE_P(AllReferenceModels, EngineGolden, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<RefModel>& info) {
                           std::string n = info.param.name;
                           for (char& c : n) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

const RefModel* find_model(const std::string& name) {
  for (const RefModel& m : kModels) {
    if (name == m.name) return &m;
  }
  return nullptr;
}

class EngineHybrid : public ::testing::TestWithParam<const char*> {};

// Turn 1, then turn 2 = turn 1's prompt + its answer + a new message, on one engine: turn 2
// restores the state snapshotted at turn 1's last prompt block and computes only the rest. A
// cold engine gives turn 2 the same tokens; so do seeded sampled requests.
TEST_P(EngineHybrid, NextTurnRestoresTheStateAndMatchesAColdRun) {
  const RefModel& rm = *find_model(GetParam());
  ThreadPool pool(2);
  EngineOptions o;
  o.kv_blocks = 256;
  o.block_size = 16;
  o.max_batch_tokens = 64;
  o.state_snapshot_interval = 64;
  auto warm = start_engine(load(rm, pool), o, rm.name);
  ASSERT_TRUE(warm);
  const int32_t vocab = warm->model_config().vocab_size;
  auto turn1 = greedy("t1", random_ids(1, 150, vocab), 20);
  auto out1 = drain(**warm->submit(turn1));
  ASSERT_EQ(out1.tokens.size(), 20u);
  EXPECT_EQ(out1.final.usage.cached_tokens, 0);

  auto turn2 = greedy("t2", turn1.prompt, 24);
  turn2.prompt.insert(turn2.prompt.end(), out1.tokens.begin(), out1.tokens.end());
  const auto extra = random_ids(2, 30, vocab);
  turn2.prompt.insert(turn2.prompt.end(), extra.begin(), extra.end());
  auto sampled = turn2;
  sampled.id = "t2-sampled";
  sampled.sampling.temperature = 0.9f;
  sampled.sampling.top_p = 0.95f;
  sampled.sampling.seed = 77;
  sampled.sampling.has_seed = true;

  const auto before = warm->stats().state_snapshots;
  auto out2 = drain(**warm->submit(turn2));
  EXPECT_EQ(out2.final.usage.cached_tokens, 128) << "turn 1's prompt, 150 tokens, down to its 64-token chunk";
  auto out2s = drain(**warm->submit(sampled));
  EXPECT_GE(out2s.final.usage.cached_tokens, 192) << "turn 2's own snapshot at its prompt end (200 -> 192)";
  const auto after = warm->stats().state_snapshots;
  EXPECT_EQ(after.restores - before.restores, 2);
  EXPECT_GT(after.count, 0);

  o.prefix_caching = false;
  auto cold = start_engine(load(rm, pool), o, rm.name);
  ASSERT_TRUE(cold);
  auto cold2 = drain(**cold->submit(turn2));
  EXPECT_EQ(cold2.final.usage.cached_tokens, 0);
  EXPECT_EQ(out2.tokens, cold2.tokens);
  EXPECT_EQ(drain(**cold->submit(sampled)).tokens, out2s.tokens);
}

// A pool too small for the batch preempts hybrid sequences; their state goes with their slot
// and they recompute (from zero, or from a snapshot with prefix caching) to the same tokens.
TEST_P(EngineHybrid, PreemptedSequencesRecomputeTheirState) {
  const RefModel& rm = *find_model(GetParam());
  ThreadPool pool(2);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    auto r = greedy("p" + std::to_string(i), random_ids(100 + uint64_t(i), 40 + 13 * i, 512), 12 + i);
    if (i % 3 == 1) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = uint64_t(i);
      r.sampling.has_seed = true;
    }
    reqs.push_back(r);
  }
  std::map<std::string, std::vector<int32_t>> alone;
  {
    EngineOptions o;
    o.kv_blocks = 256;
    o.prefix_caching = false;
    auto e = start_engine(load(rm, pool), o, rm.name);
    ASSERT_TRUE(e);
    for (const auto& r : reqs) alone[r.id] = drain(**e->submit(r)).tokens;
  }
  for (bool prefix : {false, true}) {
    EngineOptions o;
    o.kv_blocks = 20;
    o.block_size = 16;
    o.max_batch_tokens = 48;
    o.prefix_caching = prefix;
    o.state_snapshot_interval = 64;
    auto e = start_engine(load(rm, pool), o, rm.name, /*start=*/false);  // all queued before the first step
    ASSERT_TRUE(e);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& r : reqs) streams.push_back(*e->submit(r));
    e->start();
    for (auto& s : streams) EXPECT_EQ(drain(*s).tokens, alone.at(s->id())) << s->id() << " prefix " << prefix;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto st = e->stats();
    EXPECT_GT(st.preemptions, 0) << "20 blocks of 16 cannot hold 10 sequences of 50-180 tokens";
    EXPECT_EQ(st.kv.used, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Hybrids, EngineHybrid, ::testing::Values("qwen35-tiny", "qwen3next-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

// Gemma 3 (window 16, blocks of 16): a 300-token prompt decoding on holds every block in the
// full-attention pool and at most two in the sliding pool, and its tokens equal a plain run of
// the model with one block table for every layer.
TEST(EngineGemmaWindow, LongSequenceHoldsFewerSlidingBlocksThanFullOnes) {
  const RefModel& rm = *find_model("gemma3-tiny");
  ThreadPool pool(2);
  EngineOptions o;
  o.kv_blocks = 64;
  o.block_size = 16;
  o.max_batch_tokens = 64;
  o.max_num_seqs = 4;
  o.prefix_caching = false;
  auto engine = start_engine(load(rm, pool), o, rm.name);
  ASSERT_TRUE(engine);
  EXPECT_LT(engine->n_kv_window_blocks(), engine->n_kv_blocks());
  const auto prompt = random_ids(9, 300, engine->model_config().vocab_size);
  auto s = engine->submit(greedy("long", prompt, 40));
  ASSERT_TRUE(s.ok());
  std::vector<int32_t> got;
  int32_t full_min = 1 << 30, window_max = 0;
  for (;;) {
    auto e = (*s)->next(std::chrono::seconds(120));
    ASSERT_TRUE(e.has_value());
    got.insert(got.end(), e->tokens.begin(), e->tokens.end());
    if (e->final) break;
    const auto st = engine->stats();
    if (st.running == 1 && st.generated_tokens >= 1) {  // published after the prompt was in
      full_min = std::min(full_min, st.kv.used);
      window_max = std::max(window_max, st.kv_window.used);
    }
  }
  ASSERT_LT(window_max, 1 << 30);
  EXPECT_GE(full_min, 300 / 16);  // every position of the sequence in the full pool
  EXPECT_GE(window_max, 1);
  EXPECT_LE(window_max, 2);       // 16 positions span at most two blocks of 16

  auto plain = load(rm, pool);
  ASSERT_TRUE(plain);
  SingleSequence seq(*plain, 400);
  auto l = seq.prefill(prompt);
  ASSERT_TRUE(l.ok());
  std::vector<int32_t> want;
  const int32_t vocab = plain->config().vocab_size;
  while (want.size() < 40) {
    want.push_back(argmax(l->data(), vocab));
    if (want.size() == 40) break;
    l = seq.step(want.back());
    ASSERT_TRUE(l.ok());
  }
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace strata
