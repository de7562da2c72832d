// The engine with host and disk KV tiers below a pool too small to keep a 1,000-token prompt
// cached across another one: the repeated prompt is served from the host tier, or from the disk
// tier alone, with exactly the cold run's tokens; a new engine over the same disk directory (a
// restart) reports the prompt as cached and answers identically; a corrupted file in the
// directory is quarantined and the request still answers correctly (the chain loads up to the
// damaged block and recomputes the rest); concurrent requests sharing prefixes while blocks
// demote and promote produce exactly their alone runs' tokens. A session's blocks stay in the
// host and disk tiers past their LRU turn until the session TTL passes. A prefix hit on a slow
// disk is promoted in the background: a running stream keeps producing tokens meanwhile, and
// the promoted request answers exactly as its cold run.
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include <filesystem>
#include <fstream>
#include <thread>

#include "../support/engine_test_support.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/registry.h"

namespace strata {
namespace {

using namespace strata::test;

namespace fs = std::filesystem;

GenerationRequest request(int i, int32_t n_prompt, int32_t vocab) {
  GenerationRequest r;
  r.id = "req-" + std::to_string(i);
  for (int32_t k = 0; k < n_prompt; ++k) r.prompt.push_back(int32_t(3 + mix(uint64_t(i) * 7919 + uint64_t(k)) % uint64_t(vocab - 3)));
  r.max_tokens = 8;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  return r;
}

// Tier stats are published after the step that finished the request: wait for them.
KvTierStats tier_stats(Engine& e, const std::function<bool(const KvTierStats&)>& ready) {
  KvTierStats s;
  for (int i = 0; i < 200; ++i) {
    s = e.stats().kv_tiers;
    if (ready(s)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return s;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("strata_engine_tier_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

std::vector<fs::path> block_files(const fs::path& dir) {
  std::vector<fs::path> v;
  if (!fs::exists(dir)) return v;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ".kvb") v.push_back(e.path());
  }
  std::sort(v.begin(), v.end());
  return v;
}

class EngineTierTest : public ::testing::TestWithParam<std::string> {};

// 70 blocks of 16 tokens hold one 1,008-token sequence: running B evicts most of A.
EngineOptions tiny_pool() {
  EngineOptions o;
  o.kv_blocks = 70;
  return o;
}

TEST_P(EngineTierTest, RepeatedPromptHitsHostTierWithColdTokens) {
  ThreadPool pool(2);
  EngineOptions o = tiny_pool();
  o.kv_host_bytes = int64_t(256) << 20;
  auto engine = make_engine(GetParam(), pool, o);
  ASSERT_TRUE(engine);
  const int32_t vocab = engine->model_config().vocab_size;
  const auto a = request(1, 1000, vocab), b = request(2, 1000, vocab);
  const Outcome cold = run(*engine, a);
  EXPECT_EQ(cold.final.usage.cached_tokens, 0);
  run(*engine, b);
  auto again = a;
  again.id = "req-1-again";
  const Outcome warm = run(*engine, again);
  EXPECT_GE(warm.final.usage.cached_tokens, 992);
  EXPECT_EQ(warm.tokens, cold.tokens);
  const auto s = tier_stats(*engine, [](const KvTierStats& t) { return t.host_hit_blocks > 0; });
  EXPECT_TRUE(s.enabled);
  EXPECT_GT(s.demoted_blocks, 0);
  EXPECT_GE(s.host_hit_blocks, 40);  // most of A came back from host memory, not the pool
  EXPECT_EQ(s.disk_hit_blocks, 0);

  // Without tiers the same sequence of requests recomputes A.
  auto plain = make_engine(GetParam(), pool, tiny_pool());
  ASSERT_TRUE(plain);
  run(*plain, a);
  run(*plain, b);
  const Outcome recomputed = run(*plain, again);
  EXPECT_LT(recomputed.final.usage.cached_tokens, 992);
  EXPECT_EQ(recomputed.tokens, cold.tokens);
}

TEST_P(EngineTierTest, DiskTierAloneServesTheRepeatAndSurvivesARestart) {
  ThreadPool pool(2);
  const fs::path dir = fresh_dir(GetParam() + "_restart");
  EngineOptions o = tiny_pool();
  o.kv_disk_dir = dir.string();
  o.kv_disk_bytes = int64_t(1) << 30;
  Outcome cold;
  const int32_t vocab = [&] {
    auto m = load_model(model_dir(GetParam()), pool);
    return m.ok() ? (*m)->config().vocab_size : 0;
  }();
  ASSERT_GT(vocab, 3);
  const auto a = request(1, 1000, vocab), b = request(2, 1000, vocab);
  {
    auto engine = make_engine(GetParam(), pool, o);
    ASSERT_TRUE(engine);
    cold = run(*engine, a);
    EXPECT_EQ(cold.final.usage.cached_tokens, 0);
    run(*engine, b);
    ASSERT_TRUE(engine->flush_kv_tiers(30.0));
    const Outcome warm = run(*engine, a);
    EXPECT_GE(warm.final.usage.cached_tokens, 992);
    EXPECT_EQ(warm.tokens, cold.tokens);
    const auto s = tier_stats(*engine, [](const KvTierStats& t) { return t.disk_hit_blocks > 0; });
    EXPECT_GE(s.disk_hit_blocks, 40);
    EXPECT_EQ(s.host_hit_blocks, 0);
    EXPECT_EQ(s.disk.dropped_blocks, 0);
    engine->shutdown();  // writes the pool's cached blocks down too
  }
  ASSERT_FALSE(block_files(dir).empty());
  {
    // A restart: a new engine over the same directory.
    auto engine = make_engine(GetParam(), pool, o);
    ASSERT_TRUE(engine);
    auto again = a;
    again.id = "after-restart";
    const Outcome warm = run(*engine, again);
    EXPECT_GE(warm.final.usage.cached_tokens, 992);
    EXPECT_EQ(warm.tokens, cold.tokens);
    const auto s = tier_stats(*engine, [](const KvTierStats& t) { return t.disk_hit_blocks > 0; });
    EXPECT_GE(s.disk_hit_blocks, 62);
    // B too, from the files of the first engine.
    const Outcome b_again = run(*engine, b);
    EXPECT_GE(b_again.final.usage.cached_tokens, 992);
  }
  fs::remove_all(dir);
}

TEST_P(EngineTierTest, CorruptFileIsQuarantinedAndTheRequestStillAnswers) {
  ThreadPool pool(2);
  const fs::path dir = fresh_dir(GetParam() + "_corrupt");
  EngineOptions o = tiny_pool();
  o.kv_disk_dir = dir.string();
  Outcome cold;
  GenerationRequest a;
  {
    auto engine = make_engine(GetParam(), pool, o);
    ASSERT_TRUE(engine);
    a = request(1, 1000, engine->model_config().vocab_size);
    cold = run(*engine, a);
    engine->shutdown();
  }
  auto files = block_files(dir);
  ASSERT_FALSE(files.empty());
  // Flip a byte in the first tensor of the middle block of the largest file (header layout in
  // kv/disk/disk_tier.h): blocks before it in the chain still load, it fails its checksum.
  fs::path target = files[0];
  for (const auto& f : files) if (fs::file_size(f) > fs::file_size(target)) target = f;
  {
    std::fstream io(target, std::ios::in | std::ios::out | std::ios::binary);
    auto u32 = [&] { uint32_t v = 0; io.read(reinterpret_cast<char*>(&v), 4); return v; };
    io.seekg(8 + 4);
    const uint32_t id_len = u32();
    io.seekg(id_len, std::ios::cur);
    const uint32_t n_tensors = u32();
    std::vector<int64_t> tensors(n_tensors);
    io.read(reinterpret_cast<char*>(tensors.data()), std::streamsize(8 * n_tensors));
    const uint32_t n_blocks = u32();
    ASSERT_GE(n_blocks, 3u);
    const int64_t data = int64_t(io.tellg()) + 8 * int64_t(n_blocks) + 8;
    int64_t stride = 0;
    for (int64_t t : tensors) stride += t + 8;
    const int64_t pos = data + int64_t(n_blocks / 2) * stride + 3;
    io.seekg(pos);
    char c;
    io.get(c);
    io.seekp(pos);
    io.put(char(c ^ 0x41));
  }
  // And one foreign file, caught at startup.
  { std::ofstream(dir / "g00000000000000ff.kvb", std::ios::binary) << "garbage"; }
  auto engine = make_engine(GetParam(), pool, o);
  ASSERT_TRUE(engine);
  auto again = a;
  again.id = "after-corruption";
  const Outcome out = run(*engine, again);
  EXPECT_EQ(out.tokens, cold.tokens);
  // Part of the chain came from disk (before the damaged block), the rest was recomputed.
  EXPECT_GT(out.final.usage.cached_tokens, 0);
  EXPECT_LT(out.final.usage.cached_tokens, 992);
  EXPECT_EQ(out.final.finish_reason, FinishReason::kLength);
  const auto s = tier_stats(*engine, [&](const KvTierStats& t) { return t.disk.quarantined_files >= 2; });
  EXPECT_GT(s.disk_hit_blocks, 0);
  EXPECT_GE(s.disk.quarantined_files, 2);
  EXPECT_GE(std::distance(fs::directory_iterator(dir / "quarantine"), fs::directory_iterator()), 2);
  // The corrupted blocks were recomputed, never used: the answer equals the cold run above.
  engine.reset();
  fs::remove_all(dir);
}

TEST_P(EngineTierTest, ConcurrentSharedPrefixesDuringDemotionMatchAloneRuns) {
  ThreadPool pool(2);
  const fs::path dir = fresh_dir(GetParam() + "_concurrent");
  EngineOptions o;
  o.kv_blocks = 64;  // three 416-token requests at once already preempt and evict
  o.kv_host_bytes = int64_t(1) << 20;  // small: host evictions too, the rest from disk
  o.kv_disk_dir = dir.string();
  auto engine = make_engine(GetParam(), pool, o);
  ASSERT_TRUE(engine);
  const int32_t vocab = engine->model_config().vocab_size;
  std::vector<GenerationRequest> reqs;
  for (int base = 0; base < 3; ++base) {
    const auto b = request(10 + base, 400, vocab);
    for (int v = 0; v < 3; ++v) {
      auto r = b;
      r.id = "c" + std::to_string(base) + "-" + std::to_string(v);
      for (int k = 0; k < 16 + 5 * v; ++k) r.prompt.push_back(3 + (k * 31 + v * 7 + base) % (vocab - 3));
      reqs.push_back(r);
    }
  }
  auto plain = make_engine(GetParam(), pool, EngineOptions{});
  ASSERT_TRUE(plain);
  std::vector<Outcome> alone;
  for (const auto& r : reqs) alone.push_back(run(*plain, r));
  for (int round = 0; round < 3; ++round) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (auto r : reqs) {
      r.id += "-round" + std::to_string(round);
      auto st = engine->submit(r);
      ASSERT_TRUE(st.ok()) << st.error().to_string();
      streams.push_back(*st);
    }
    for (size_t i = 0; i < reqs.size(); ++i) {
      const Outcome out = drain(*streams[i]);
      EXPECT_EQ(out.tokens, alone[i].tokens) << reqs[i].id << " round " << round;
      EXPECT_EQ(out.final.finish_reason, FinishReason::kLength) << reqs[i].id;
    }
  }
  const auto s = tier_stats(*engine, [](const KvTierStats& t) { return t.host_hit_blocks + t.disk_hit_blocks > 0; });
  EXPECT_GT(s.demoted_blocks, 0);
  EXPECT_GT(s.host_hit_blocks + s.disk_hit_blocks, 0);
  engine.reset();
  fs::remove_all(dir);
}

// Runs S (a session's request when `session`), then three other 1,000-token prompts that push
// S out of the 70-block pool and, past LRU, out of a lower tier of about 80 blocks (host memory
// when `host`, else disk), then S again. Returns the cold run of S and its repeat.
std::pair<Outcome, Outcome> session_scenario(const std::string& model, bool host, bool session, double ttl_s,
                                             double sleep_s) {
  ThreadPool pool(2);
  EngineOptions o = tiny_pool();
  o.session_ttl_s = ttl_s;
  int64_t block_bytes = 0;
  int32_t vocab = 0;
  {
    auto probe = make_engine(model, pool, tiny_pool());
    if (!probe) return {};
    block_bytes = probe->kv_bytes_per_token() * probe->block_size();
    vocab = probe->model_config().vocab_size;
  }
  const fs::path dir = fresh_dir(model + "_session");
  if (host) {
    o.kv_host_bytes = 80 * block_bytes;
  } else {
    o.kv_disk_dir = dir.string();
    o.kv_disk_bytes = 80 * block_bytes;  // checksums and headers make the files a little larger
  }
  auto engine = make_engine(model, pool, o);
  if (!engine) return {};
  auto s = request(1, 1000, vocab);
  if (session) s.session_id = "chat-1";
  const Outcome cold = run(*engine, s);
  if (sleep_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
  for (int i = 2; i <= 4; ++i) {
    run(*engine, request(i, 1000, vocab));
    if (!host) EXPECT_TRUE(engine->flush_kv_tiers(30.0));
  }
  auto again = s;
  again.id = "req-1-again";
  const Outcome warm = run(*engine, again);
  engine.reset();
  fs::remove_all(dir);
  return {cold, warm};
}

TEST_P(EngineTierTest, SessionBlocksStayInTheHostTierForTheTtl) {
  const auto [cold, warm] = session_scenario(GetParam(), true, true, 600.0, 0.0);
  EXPECT_GE(warm.final.usage.cached_tokens, 992);
  EXPECT_EQ(warm.tokens, cold.tokens);
  // Without a session the same traffic pushes S out of the host tier.
  const auto [cold2, plain] = session_scenario(GetParam(), true, false, 600.0, 0.0);
  EXPECT_LT(plain.final.usage.cached_tokens, 992);
  EXPECT_EQ(plain.tokens, cold.tokens);
  // Once the TTL has passed the session's blocks are ordinary LRU blocks again.
  const auto [cold3, expired] = session_scenario(GetParam(), true, true, 0.5, 0.7);
  EXPECT_LT(expired.final.usage.cached_tokens, 992);
  EXPECT_EQ(expired.tokens, cold.tokens);
}

TEST_P(EngineTierTest, SessionBlocksStayInTheDiskTierForTheTtl) {
  const auto [cold, warm] = session_scenario(GetParam(), false, true, 600.0, 0.0);
  EXPECT_GE(warm.final.usage.cached_tokens, 992);
  EXPECT_EQ(warm.tokens, cold.tokens);
  const auto [cold2, plain] = session_scenario(GetParam(), false, false, 600.0, 0.0);
  EXPECT_LT(plain.final.usage.cached_tokens, 992);
  EXPECT_EQ(plain.tokens, cold.tokens);
}

TEST_P(EngineTierTest, DiskPromotionRunsWhileAStreamKeepsDecoding) {
  ThreadPool pool(2);
  const fs::path dir = fresh_dir(GetParam() + "_async");
  EngineOptions o;
  o.kv_blocks = 160;
  o.kv_disk_dir = dir.string();
  int32_t vocab = 0;
  Outcome cold, stream_alone;
  GenerationRequest streamer;
  const auto a = [&] {
    auto engine = make_engine(GetParam(), pool, o);
    EXPECT_TRUE(engine);
    if (!engine) return GenerationRequest{};
    vocab = engine->model_config().vocab_size;
    auto r = request(1, 1000, vocab);
    cold = run(*engine, r);
    streamer = request(2, 16, vocab);
    streamer.max_tokens = 600;
    stream_alone = run(*engine, streamer);
    engine->shutdown();  // A's blocks go to disk
    return r;
  }();
  ASSERT_GT(vocab, 3);
  // A restart over a slow disk: each block read takes 20 ms, about 1.3 s for A's 63 blocks.
  o.kv_disk_read_delay_s = 0.02;
  auto engine = make_engine(GetParam(), pool, o);
  ASSERT_TRUE(engine);
  auto st = engine->submit(streamer);
  ASSERT_TRUE(st.ok());
  std::atomic<int> streamed{0};
  Outcome stream_out;
  std::thread reader([&] {
    for (;;) {
      auto e = (*st)->next(std::chrono::seconds(300));
      if (!e) return;
      stream_out.tokens.insert(stream_out.tokens.end(), e->tokens.begin(), e->tokens.end());
      streamed.store(int(stream_out.tokens.size()));
      if (e->final) {
        stream_out.final = *e;
        return;
      }
    }
  });
  while (streamed.load() < 2) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto again = a;
  again.id = "after-restart";
  auto sa = engine->submit(again);
  ASSERT_TRUE(sa.ok());
  const auto t0 = std::chrono::steady_clock::now();
  const int at_submit = streamed.load();
  Outcome warm;
  int at_first_token = -1;
  for (;;) {
    auto e = (*sa)->next(std::chrono::seconds(300));
    ASSERT_TRUE(e.has_value());
    if (at_first_token < 0 && !e->tokens.empty()) at_first_token = streamed.load();
    warm.tokens.insert(warm.tokens.end(), e->tokens.begin(), e->tokens.end());
    if (e->final) {
      warm.final = *e;
      break;
    }
  }
  const double first_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  reader.join();
  // The promotion really read A from the slow disk...
  EXPECT_GE(warm.final.usage.cached_tokens, 992);
  EXPECT_GE(first_s, 1.0);
  // ...while the running stream kept stepping (a promotion inside the step would stall it).
  EXPECT_GE(at_first_token - at_submit, 10) << "stream tokens at A's submit " << at_submit << ", at A's first token "
                                            << at_first_token;
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(stream_out.tokens, stream_alone.tokens);
  const auto s = tier_stats(*engine, [](const KvTierStats& t) { return t.disk_hit_blocks >= 62; });
  EXPECT_GE(s.disk_hit_blocks, 62);
  engine.reset();
  fs::remove_all(dir);
}

// A request cancelled while its blocks are being promoted ends cleanly; the blocks that were
// being copied go back to the pool and a later request still answers exactly.
TEST_P(EngineTierTest, CancelDuringPromotionLeavesThePoolWhole) {
  ThreadPool pool(2);
  const fs::path dir = fresh_dir(GetParam() + "_cancel");
  EngineOptions o;
  o.kv_blocks = 70;
  o.kv_disk_dir = dir.string();
  GenerationRequest a;
  Outcome cold;
  {
    auto engine = make_engine(GetParam(), pool, o);
    ASSERT_TRUE(engine);
    a = request(1, 1000, engine->model_config().vocab_size);
    cold = run(*engine, a);
    engine->shutdown();
  }
  o.kv_disk_read_delay_s = 0.01;
  auto engine = make_engine(GetParam(), pool, o);
  ASSERT_TRUE(engine);
  auto first = a;
  first.id = "cancelled";
  auto st = engine->submit(first);
  ASSERT_TRUE(st.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  (*st)->cancel();
  const Outcome c = drain(**st);
  EXPECT_EQ(c.final.finish_reason, FinishReason::kCancelled);
  // The whole pool is usable again: a 1,000-token request needs 64 of its 70 blocks.
  auto again = a;
  again.id = "after-cancel";
  const Outcome out = run(*engine, again);
  EXPECT_EQ(out.final.finish_reason, FinishReason::kLength);
  EXPECT_EQ(out.tokens, cold.tokens);
  engine.reset();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineTierTest, ::testing::Values("llama3-tiny", "qwen3-tiny"));

}  // namespace
}  // namespace strata
