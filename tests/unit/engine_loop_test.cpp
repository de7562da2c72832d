// The engine loop with a fake model whose logits depend on every token and position it reads
// back through its KV blocks: batch invariance under chunking, preemption and prefix reuse,
// the pool returning to empty, cancellation, stops, logprobs, step failures, admission errors.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <map>
#include <thread>

#include "../support/engine_test_support.h"
#include "core/check.h"
#include "engine/engine.h"

namespace strata {
namespace {

using test::drain;
using test::Outcome;

constexpr int32_t kVocab = 64;
constexpr int32_t kPoison = 63;  // a prompt holding it makes forward() throw InvariantError

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// One layer, one KV head of width 2: K holds (token, position) of every cached position. The
// logits of position p are a hash of the (token, position) pairs read back from the block
// table for positions [0, p], so a wrong block, a stale cached block or a position written to
// the wrong slot changes every later token.
class FakeModel final : public Model {
 public:
  FakeModel(ThreadPool& pool, int32_t window = 0) : Model(make_config(), pool), window_(window) {}
  static ModelConfig make_config() {
    ModelConfig c;
    c.model_type = "fake";
    c.vocab_size = kVocab;
    c.n_layers = 1;
    c.max_position = 4096;
    c.eos_ids = {2};
    return c;
  }
  std::vector<KvLayerSpec> kv_layout() const override {
    KvLayerSpec s;
    s.n_kv_heads = 1;
    s.head_dim_k = 2;
    s.head_dim_v = 2;
    s.window = window_;
    return {s};
  }
  void forward(const StepBatch& batch, KvStorage& kv, StateStorage*, float* logits) override {
    const int32_t bs = kv.block_size();
    float* k = kv.k_pool(0);
    size_t t = 0;
    float* out = logits;
    for (const auto& s : batch.seqs) {
      for (int32_t i = 0; i < s.n_tokens; ++i) {
        STRATA_CHECK(batch.tokens[t + size_t(i)] != kPoison, "poisoned token");
        const int32_t p = s.pos0 + i;
        float* slot = k + (size_t(s.block_table.at(size_t(p / bs))) * size_t(bs) + size_t(p % bs)) * 2;
        slot[0] = float(batch.tokens[t + size_t(i)]);
        slot[1] = float(p);
      }
      for (int32_t i = 0; i < s.n_tokens; ++i) {
        if (!(s.logits_all || (s.logits_last && i == s.n_tokens - 1))) continue;
        uint64_t h = 0;
        for (int32_t q = 0; q <= s.pos0 + i; ++q) {
          const float* slot = k + (size_t(s.block_table.at(size_t(q / bs))) * size_t(bs) + size_t(q % bs)) * 2;
          h = mix(h ^ (uint64_t(int64_t(slot[0])) * 131 + uint64_t(int64_t(slot[1]))));
        }
        for (int32_t v = 0; v < kVocab; ++v) out[v] = float(mix(h ^ uint64_t(v)) % 1000) / 100.0f;
        out += kVocab;
      }
      t += size_t(s.n_tokens);
    }
    ++forward_calls;
    if (step_delay_ms.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms.load()));
  }
  int64_t forward_calls = 0;
  std::atomic<int> step_delay_ms{0};  // makes long generations outlast a cancel

 private:
  int32_t window_;
};

// With start false the caller starts the engine once its requests are queued.
std::unique_ptr<Engine> make_engine(ThreadPool& pool, EngineOptions o, FakeModel** raw = nullptr, bool start = true) {
  auto m = std::make_unique<FakeModel>(pool);
  if (raw) *raw = m.get();
  auto e = Engine::create(std::move(m), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  if (start) (*e)->start();
  return std::move(e).value();
}

GenerationRequest make_request(const std::string& id, int32_t n_prompt, uint64_t seed_salt, int32_t max_tokens,
                               bool greedy) {
  GenerationRequest r;
  r.id = id;
  for (int32_t i = 0; i < n_prompt; ++i) r.prompt.push_back(int32_t(3 + mix(seed_salt * 1000 + uint64_t(i)) % 59));
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.vocab_limit = kPoison;  // never generated, only planted
  r.sampling.temperature = greedy ? 0.0f : 0.9f;
  r.sampling.top_k = greedy ? 0 : 20;
  r.sampling.seed = seed_salt;
  r.sampling.has_seed = true;
  return r;
}

std::vector<GenerationRequest> workload() {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 12; ++i) {
    reqs.push_back(make_request("r" + std::to_string(i), 1 + (i * 7) % 40, uint64_t(i + 1), 5 + i % 9, i % 2 == 0));
  }
  // Two requests sharing a long prefix with the first one.
  auto shared = reqs[3];
  shared.id = "shared";
  shared.prompt.resize(20, 9);
  reqs.push_back(shared);
  return reqs;
}

std::map<std::string, std::vector<int32_t>> run_alone(ThreadPool& pool) {
  std::map<std::string, std::vector<int32_t>> out;
  EngineOptions o;
  o.kv_blocks = 256;
  o.block_size = 4;
  o.prefix_caching = false;
  for (const auto& r : workload()) {
    auto engine = make_engine(pool, o);
    auto s = engine->submit(r);
    EXPECT_TRUE(s.ok());
    out[r.id] = drain(**s).tokens;
  }
  return out;
}

TEST(EngineLoop, ConcurrentRequestsMatchAloneUnderAnyBudgetPoolAndCache) {
  ThreadPool pool(1);
  const auto alone = run_alone(pool);
  struct Config { int32_t budget, blocks, max_seqs; bool prefix; };
  for (Config c : {Config{512, 256, 64, true}, Config{7, 256, 64, true}, Config{3, 40, 5, true}, Config{16, 24, 64, false},
                   Config{16, 24, 64, true}}) {
    EngineOptions o;
    o.kv_blocks = c.blocks;
    o.block_size = 4;
    o.max_batch_tokens = c.budget;
    o.max_num_seqs = c.max_seqs;
    o.prefix_caching = c.prefix;
    auto engine = make_engine(pool, o, nullptr, /*start=*/false);  // all queued before the first step
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& r : workload()) {
      auto s = engine->submit(r);
      ASSERT_TRUE(s.ok()) << s.error().to_string();
      streams.push_back(*s);
    }
    engine->start();
    for (auto& s : streams) {
      auto o2 = drain(*s);
      EXPECT_EQ(o2.tokens, alone.at(s->id())) << s->id() << " budget " << c.budget << " blocks " << c.blocks;
      EXPECT_EQ(o2.final.finish_reason, FinishReason::kLength);
    }
    // Only cached blocks remain once everything finished.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    auto st = engine->stats();
    EXPECT_EQ(st.kv.used, 0);
    EXPECT_EQ(st.kv.used + st.kv.free + st.kv.cached, c.blocks);
    EXPECT_EQ(st.running, 0);
    EXPECT_EQ(st.queue_depth, 0);
    EXPECT_EQ(st.finished[int(FinishReason::kLength)], int64_t(streams.size()));
    if (c.blocks == 24) {
      EXPECT_GT(st.preemptions, 0) << "the small pool should force preemption";
    }
    if (!c.prefix) {
      EXPECT_EQ(st.kv.cached, 0);
    }
  }
}

TEST(EngineLoop, SharedPrefixIsServedFromTheCache) {
  ThreadPool pool(1);
  EngineOptions o;
  o.kv_blocks = 512;
  o.block_size = 16;
  auto engine = make_engine(pool, o);
  auto first = make_request("a", 1000, 42, 8, true);
  auto second = first;
  second.id = "b";
  second.prompt.push_back(17);  // shares the 1,000-token prefix
  auto cold = first;
  cold.id = "cold";
  auto s1 = engine->submit(first);
  ASSERT_TRUE(s1.ok());
  auto o1 = drain(**s1);
  EXPECT_EQ(o1.final.usage.cached_tokens, 0);
  auto s2 = engine->submit(second);
  ASSERT_TRUE(s2.ok());
  auto o2 = drain(**s2);
  EXPECT_GE(o2.final.usage.cached_tokens, 992);
  EXPECT_EQ(o2.final.usage.prompt_tokens, 1001);
  // The same prompt again: everything but the last block's worth is reused, same tokens.
  auto s3 = engine->submit(cold);
  ASSERT_TRUE(s3.ok());
  auto o3 = drain(**s3);
  EXPECT_EQ(o3.tokens, o1.tokens);
  EXPECT_EQ(o3.final.usage.cached_tokens, 992);  // 1000 = 62.5 blocks: 62 full blocks reused
  EXPECT_GE(engine->stats().prefix_hit_tokens, 992 * 2);

  // A cold engine gives the second request the same tokens.
  auto cold_engine = make_engine(pool, o);
  auto s4 = cold_engine->submit(second);
  ASSERT_TRUE(s4.ok());
  EXPECT_EQ(drain(**s4).tokens, o2.tokens);
}

TEST(EngineLoop, CancelAndDroppedStreamsFreeBlocks) {
  ThreadPool pool(1);
  EngineOptions o;
  o.kv_blocks = 64;
  o.block_size = 4;
  o.prefix_caching = false;
  FakeModel* model = nullptr;
  auto engine = make_engine(pool, o, &model);
  model->step_delay_ms = 2;
  auto r = make_request("long", 10, 3, 200, true);
  auto s = engine->submit(r);
  ASSERT_TRUE(s.ok());
  ASSERT_TRUE((*s)->next(std::chrono::seconds(10)).has_value());  // running
  EXPECT_TRUE(engine->cancel("long"));
  auto out = drain(**s);
  EXPECT_EQ(out.final.finish_reason, FinishReason::kCancelled);
  EXPECT_LT(out.final.usage.completion_tokens, 200);
  EXPECT_FALSE(engine->cancel("unknown"));

  auto s2 = engine->submit(make_request("dropped", 10, 4, 200, true));
  ASSERT_TRUE(s2.ok());
  ASSERT_TRUE((*s2)->next(std::chrono::seconds(10)).has_value());
  s2->reset();  // the client went away
  for (int i = 0; i < 500 && engine->stats().finished[int(FinishReason::kCancelled)] < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  auto st = engine->stats();
  EXPECT_EQ(st.finished[int(FinishReason::kCancelled)], 2);
  EXPECT_EQ(st.kv.used, 0);
  EXPECT_EQ(st.kv.free, 64);
  // The id can be used again.
  auto s3 = engine->submit(make_request("long", 4, 3, 2, true));
  ASSERT_TRUE(s3.ok());
  EXPECT_EQ(drain(**s3).tokens.size(), 2u);
}

TEST(EngineLoop, StopIdsEosAndMaxTokens) {
  ThreadPool pool(1);
  EngineOptions o;
  o.kv_blocks = 64;
  o.block_size = 4;
  auto engine = make_engine(pool, o);
  auto r = make_request("free", 5, 11, 30, true);
  auto full = drain(**engine->submit(r)).tokens;
  ASSERT_EQ(full.size(), 30u);
  // Stop at the fourth token's id: the earlier tokens come out, the stop id does not.
  auto stopped = r;
  stopped.id = "stopped";
  stopped.stop_ids = {full[3]};
  const size_t first = size_t(std::find(full.begin(), full.end(), full[3]) - full.begin());
  auto out = drain(**engine->submit(stopped));
  EXPECT_EQ(out.final.finish_reason, FinishReason::kStop);
  EXPECT_EQ(out.final.stop_token, full[3]);
  EXPECT_EQ(out.tokens, std::vector<int32_t>(full.begin(), full.begin() + long(first)));
  EXPECT_EQ(out.final.usage.completion_tokens, int32_t(first) + 1);
  // EOS (id 2 in the fake config) stops unless ignore_eos; vocab_limit keeps ids out.
  auto eos = r;
  eos.id = "eos";
  eos.ignore_eos = false;
  eos.sampling.logit_bias = {{2, 100.0f}};
  auto oe = drain(**engine->submit(eos));
  EXPECT_EQ(oe.final.finish_reason, FinishReason::kStop);
  EXPECT_EQ(oe.final.stop_token, 2);
  EXPECT_TRUE(oe.tokens.empty());
  auto limited = r;
  limited.id = "limited";
  limited.vocab_limit = 10;
  limited.sampling.temperature = 1.0f;
  for (int32_t t : drain(**engine->submit(limited)).tokens) EXPECT_LT(t, 10);
}

TEST(EngineLoop, LogprobsOfGeneratedAndPromptTokens) {
  ThreadPool pool(1);
  EngineOptions o;
  o.kv_blocks = 64;
  o.block_size = 4;
  auto engine = make_engine(pool, o);
  auto warm = make_request("warm", 12, 5, 3, true);
  (void)drain(**engine->submit(warm));  // caches the prompt's blocks
  auto r = warm;
  r.id = "lp";
  r.logprobs = 5;
  r.prompt_logprobs = true;
  r.max_tokens = 4;
  auto out = drain(**engine->submit(r));
  ASSERT_EQ(out.tokens.size(), 4u);
  ASSERT_EQ(out.logprobs.size(), 4u);
  ASSERT_EQ(out.prompt_logprobs.size(), 11u);
  EXPECT_EQ(out.final.usage.cached_tokens, 0);  // prompt logprobs compute the whole prompt
  for (size_t i = 0; i < out.prompt_logprobs.size(); ++i) EXPECT_EQ(out.prompt_logprobs[i].chosen.token, r.prompt[i + 1]);
  for (size_t i = 0; i < 4; ++i) {
    const auto& lp = out.logprobs[i];
    EXPECT_EQ(lp.chosen.token, out.tokens[i]);
    ASSERT_EQ(lp.top.size(), 5u);
    EXPECT_FLOAT_EQ(lp.top[0].logprob, lp.chosen.logprob);  // greedy picks the top token
    for (size_t j = 1; j < lp.top.size(); ++j) EXPECT_LE(lp.top[j].logprob, lp.top[j - 1].logprob);
    EXPECT_LT(lp.chosen.logprob, 0.0f);
  }
  // Same tokens as without logprobs.
  auto plain = warm;
  plain.id = "plain";
  plain.max_tokens = 4;
  EXPECT_EQ(drain(**engine->submit(plain)).tokens, out.tokens);
}

TEST(EngineLoop, InvariantErrorFailsOnlyThatStepsRequests) {
  ThreadPool pool(1);
  EngineOptions o;
  o.kv_blocks = 64;
  o.block_size = 4;
  o.prefix_caching = false;
  FakeModel* model = nullptr;
  auto engine = make_engine(pool, o, &model);
  model->step_delay_ms = 1;
  auto good = make_request("good", 6, 1, 200, true);
  auto sg = engine->submit(good);
  ASSERT_TRUE(sg.ok());
  ASSERT_TRUE((*sg)->next(std::chrono::seconds(10)).has_value());
  auto bad = make_request("bad", 6, 2, 4, true);
  bad.prompt[3] = kPoison;
  auto ob = drain(**engine->submit(bad));
  EXPECT_EQ(ob.final.finish_reason, FinishReason::kError);
  EXPECT_NE(ob.final.message.find("poisoned"), std::string::npos) << ob.final.message;
  EXPECT_TRUE(engine->alive());
  // `good` shared the failing step only if it was scheduled then; either way the engine serves on.
  auto later = drain(**engine->submit(make_request("later", 6, 3, 3, true)));
  EXPECT_EQ(later.final.finish_reason, FinishReason::kLength);
  engine->cancel("good");
  (void)drain(**sg);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(engine->stats().kv.used, 0);
}

TEST(EngineLoop, AdmissionErrors) {
  ThreadPool pool(1);
  EngineOptions o;
  o.kv_blocks = 8;
  o.block_size = 4;
  o.max_model_len = 100;
  o.max_queued = 2;
  auto model = std::make_unique<FakeModel>(pool);
  auto e = Engine::create(std::move(model), o);
  ASSERT_TRUE(e.ok());
  Engine& engine = **e;  // not started: requests stay queued
  auto too_long = make_request("x", 90, 1, 20, true);
  auto r = engine.submit(too_long);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(r.error().message.find("90"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("20"), std::string::npos) << r.error().message;
  EXPECT_NE(r.error().message.find("100"), std::string::npos) << r.error().message;
  auto too_big = engine.submit(make_request("y", 30, 1, 10, true));  // 10 blocks > 8
  ASSERT_FALSE(too_big.ok());
  EXPECT_NE(too_big.error().message.find("KV blocks"), std::string::npos);
  auto bad_lp = make_request("z", 3, 1, 2, true);
  bad_lp.logprobs = 21;
  EXPECT_EQ(engine.submit(bad_lp).error().code, ErrorCode::kInvalidArgument);
  auto bad_tok = make_request("t", 3, 1, 2, true);
  bad_tok.prompt[1] = kVocab;
  EXPECT_EQ(engine.submit(bad_tok).error().code, ErrorCode::kInvalidArgument);
  auto bad_temp = make_request("u", 3, 1, 2, true);
  bad_temp.sampling.top_p = 1.5f;
  EXPECT_EQ(engine.submit(bad_temp).error().code, ErrorCode::kInvalidArgument);

  auto q1 = engine.submit(make_request("q1", 3, 1, 2, true));
  ASSERT_TRUE(q1.ok());
  auto dup = engine.submit(make_request("q1", 3, 1, 2, true));
  EXPECT_EQ(dup.error().code, ErrorCode::kInvalidArgument);
  auto q2 = engine.submit(make_request("q2", 3, 1, 2, true));
  ASSERT_TRUE(q2.ok());
  auto q3 = engine.submit(make_request("q3", 3, 1, 2, true));
  ASSERT_FALSE(q3.ok());
  EXPECT_EQ(q3.error().code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(engine.stats().queue_depth, 2);
  engine.start();
  EXPECT_EQ(drain(**q1).tokens.size(), 2u);
  EXPECT_EQ(drain(**q2).tokens.size(), 2u);
  EXPECT_EQ(engine.stats().queue_depth, 0);
  engine.shutdown();
  EXPECT_FALSE(engine.alive());
  EXPECT_FALSE(engine.submit(make_request("after", 3, 1, 2, true)).ok());
}

TEST(EngineLoop, SlidingWindowModelsGetAWindowPoolAndBadPoliciesAreRefused) {
  ThreadPool pool(1);
  // Only sliding layers: the window pool holds the bytes, the full pool is bookkeeping.
  auto e = Engine::create(std::make_unique<FakeModel>(pool, 16), EngineOptions{});
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_GT((*e)->n_kv_window_blocks(), 0);
  EngineOptions bad;
  bad.scheduling_policy = "lifo";
  auto p = Engine::create(std::make_unique<FakeModel>(pool), bad);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("lifo"), std::string::npos);
}

TEST(EngineLoop, SessionBlocksArePinnedAfterTheRequest) {
  ThreadPool pool(1);
  EngineOptions o;
  o.kv_blocks = 64;
  o.block_size = 4;
  auto engine = make_engine(pool, o);
  auto r = make_request("s", 16, 9, 4, true);
  r.session_id = "conv-1";
  (void)drain(**engine->submit(r));
  auto plain = make_request("p", 16, 10, 4, true);
  (void)drain(**engine->submit(plain));
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  auto st = engine->stats();
  EXPECT_EQ(st.kv.pinned, 4);   // 16 + 3 computed tokens: 4 full blocks of the session
  EXPECT_EQ(st.kv.cached, 8);
  EXPECT_EQ(st.ttft.count, 2);
  EXPECT_EQ(st.inter_token.count, 6);
}

}  // namespace
}  // namespace strata
