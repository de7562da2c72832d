// The engine on real reference checkpoints: greedy output equals the Hugging Face oracle;
// 32 concurrent requests (greedy and seeded) produce exactly the tokens each produces alone,
// whatever the step budget, pool size (preemption) and prefix cache; a shared 1,000-token
// prefix is served from the cache with the same tokens; cancel frees blocks; an over-long
// request is refused naming its numbers.
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

GenerationRequest request(int i, int32_t n_prompt, int32_t max_tokens, bool greedy, int32_t vocab) {
  GenerationRequest r;
  r.id = "req-" + std::to_string(i);
  for (int32_t k = 0; k < n_prompt; ++k) r.prompt.push_back(int32_t(3 + mix(uint64_t(i) * 7919 + uint64_t(k)) % uint64_t(vocab - 3)));
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  if (greedy) {
    r.sampling.temperature = 0.0f;
  } else {
    r.sampling.temperature = 0.8f;
    r.sampling.top_p = 0.9f;
    r.sampling.seed = uint64_t(1000 + i);
    r.sampling.has_seed = true;
  }
  return r;
}

std::vector<GenerationRequest> workload(int32_t vocab) {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 32; ++i) {
    reqs.push_back(request(i, 1 + int32_t(mix(uint64_t(i)) % 150), 6 + i % 11, i % 2 == 0, vocab));
  }
  // Requests that share prefixes with earlier ones (full blocks and a partial one).
  for (int i : {4, 9, 17}) {
    auto& base = reqs[size_t(i)];
    base.prompt.resize(std::max<size_t>(base.prompt.size(), 70), 5);
    auto& other = reqs[size_t(i + 1)];
    other.prompt = base.prompt;
    other.prompt.resize(base.prompt.size() - 13);
    other.prompt.push_back(7);
  }
  return reqs;
}

class EngineModelTest : public ::testing::TestWithParam<const char*> {};

TEST_P(EngineModelTest, GreedyMatchesTheReference) {
  ThreadPool pool(2);
  EngineOptions o;
  o.kv_blocks = 256;
  auto engine = make_engine(GetParam(), pool, o);
  ASSERT_TRUE(engine);
  const auto cases = golden::cases_for(GetParam());
  ASSERT_FALSE(cases.empty());
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t c = 0; c < cases.size(); ++c) {
    GenerationRequest r;
    r.id = "golden-" + std::to_string(c);
    r.prompt = cases[c].prompt_ids;
    r.max_tokens = int32_t(cases[c].greedy_ids.size());
    r.ignore_eos = true;
    r.sampling.temperature = 0.0f;
    auto s = engine->submit(r);
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    streams.push_back(*s);
  }
  for (size_t c = 0; c < cases.size(); ++c) EXPECT_EQ(drain(*streams[c]).tokens, cases[c].greedy_ids) << "case " << c;
}

TEST_P(EngineModelTest, ConcurrentRequestsProduceTheTokensTheyProduceAlone) {
  ThreadPool pool(2);
  std::map<std::string, std::vector<int32_t>> alone;
  {
    EngineOptions o;
    o.kv_blocks = 64;
    o.prefix_caching = false;
    auto engine = make_engine(GetParam(), pool, o);
    ASSERT_TRUE(engine);
    for (const auto& r : workload(engine->model_config().vocab_size)) {
      auto s = engine->submit(r);
      ASSERT_TRUE(s.ok()) << s.error().to_string();
      auto out = drain(**s);
      EXPECT_EQ(int32_t(out.tokens.size()), r.max_tokens);
      alone[r.id] = out.tokens;
    }
  }
  struct Config { int32_t budget, blocks; bool prefix; };
  // Hybrids cut prefill only on 64-token chunks, so fewer sequences hold blocks at once: a
  // smaller pool still preempts them.
  const std::string family = GetParam();
  const bool hybrid = family.rfind("qwen3next", 0) == 0 || family.rfind("qwen35", 0) == 0;
  for (Config c : {Config{4096, 512, true}, Config{37, 512, false}, Config{61, hybrid ? 24 : 48, true}}) {
    EngineOptions o;
    o.max_batch_tokens = c.budget;
    o.kv_blocks = c.blocks;
    o.prefix_caching = c.prefix;
    // Every request is queued before the first step is planned: the small pool then has to
    // preempt however slowly this thread submits (a loaded machine).
    auto engine = make_engine(GetParam(), pool, o, /*start=*/false);
    ASSERT_TRUE(engine);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& r : workload(engine->model_config().vocab_size)) {
      auto s = engine->submit(r);
      ASSERT_TRUE(s.ok()) << s.error().to_string();
      streams.push_back(*s);
    }
    engine->start();
    for (auto& s : streams) {
      EXPECT_EQ(drain(*s).tokens, alone.at(s->id())) << s->id() << " budget " << c.budget << " blocks " << c.blocks;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto st = engine->stats();
    EXPECT_EQ(st.kv.used, 0) << "only cached blocks may remain";
    EXPECT_EQ(st.kv.free + st.kv.cached, c.blocks);
    EXPECT_EQ(st.running + st.waiting + st.queue_depth, 0);
    if (c.blocks < 512) {
      EXPECT_GT(st.preemptions, 0) << c.blocks << " blocks cannot hold 32 sequences at once";
    }
  }
}

TEST_P(EngineModelTest, SharedThousandTokenPrefixIsCached) {
  ThreadPool pool(2);
  EngineOptions o;
  o.kv_blocks = 256;
  auto engine = make_engine(GetParam(), pool, o);
  ASSERT_TRUE(engine);
  const int32_t vocab = engine->model_config().vocab_size;
  auto first = request(1, 1000, 8, true, vocab);
  auto second = request(2, 1000, 8, true, vocab);
  second.prompt = first.prompt;
  for (int k = 0; k < 24; ++k) second.prompt.push_back(10 + k);
  auto o1 = drain(**engine->submit(first));
  EXPECT_EQ(o1.final.usage.cached_tokens, 0);
  auto o2 = drain(**engine->submit(second));
  // Hybrids restore state only at multiples of their 64-token prefill chunk (1000 -> 960).
  const int32_t align = engine->stats().state_snapshots.stores > 0 ? 64 : 16;
  EXPECT_GE(o2.final.usage.cached_tokens, 1000 / align * align);
  EXPECT_EQ(o2.final.usage.prompt_tokens, 1024);

  auto cold = make_engine(GetParam(), pool, o);
  ASSERT_TRUE(cold);
  auto o3 = drain(**cold->submit(second));
  EXPECT_EQ(o3.final.usage.cached_tokens, 0);
  EXPECT_EQ(o2.tokens, o3.tokens);
}

TEST_P(EngineModelTest, CancelFreesBlocksAndOverLongIsRefused) {
  ThreadPool pool(2);
  EngineOptions o;
  o.kv_blocks = 256;
  o.prefix_caching = false;
  auto engine = make_engine(GetParam(), pool, o);
  ASSERT_TRUE(engine);
  const int32_t vocab = engine->model_config().vocab_size;
  auto s = engine->submit(request(3, 300, 2000, true, vocab));
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->next(std::chrono::seconds(60)).has_value());
  EXPECT_TRUE(engine->cancel("req-3"));
  auto out = drain(**s);
  EXPECT_EQ(out.final.finish_reason, FinishReason::kCancelled);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(engine->stats().kv.used, 0);
  EXPECT_EQ(engine->stats().kv.free, 256);

  const int32_t max_len = engine->max_model_len();
  auto too_long = engine->submit(request(4, max_len - 10, 11, true, vocab));
  ASSERT_FALSE(too_long.ok());
  EXPECT_EQ(too_long.error().code, ErrorCode::kInvalidArgument);
  const std::string& msg = too_long.error().message;
  EXPECT_NE(msg.find(std::to_string(max_len - 10)), std::string::npos) << msg;
  EXPECT_NE(msg.find("max_tokens (11)"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(max_len)), std::string::npos) << msg;
}

INSTANTIATE_TEST_SUITE_P(Families, EngineModelTest,
                         ::testing::Values("qwen3-tiny", "llama3-tiny", "gemma3-tiny", "gemma4-tiny", "qwen35-tiny",
                                           "qwen3next-tiny"));

}  // namespace
}  // namespace strata
