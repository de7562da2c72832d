// KV tiers for the families whose prefix hit needs more than full-attention blocks: the
// sliding-window layers' blocks (gemma3-tiny, gemma4-tiny: 16-token windows) and the recurrent
// state snapshot at the hit (qwen35-tiny, gated DeltaNet). A 300-token prompt, past the
// windows, then a restart over the same disk directory: the repeat is a disk-tier hit (full
// blocks, window blocks, the snapshot) with exactly the cold run's tokens, and so is a next
// turn that extends the first. Window blocks a small pool evicts come back from host memory;
// snapshots a small snapshot store drops come back from disk; window blocks come back under
// full blocks the device still holds. Each warm run is checked against
// a cold run of the same prompt on an engine without tiers.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <thread>

#include "../support/engine_test_support.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/registry.h"

namespace strata {
namespace {

using namespace strata::test;

namespace fs = std::filesystem;

std::vector<int32_t> prompt_tokens(int i, int32_t n, int32_t vocab) {
  std::vector<int32_t> p;
  for (int32_t k = 0; k < n; ++k) p.push_back(int32_t(3 + mix(uint64_t(i) * 7919 + uint64_t(k)) % uint64_t(vocab - 3)));
  return p;
}

GenerationRequest request(const std::string& id, std::vector<int32_t> prompt) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = 8;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  return r;
}

EngineStats stats_when(Engine& e, const std::function<bool(const EngineStats&)>& ready) {
  EngineStats s;
  for (int i = 0; i < 200; ++i) {
    s = e.stats();
    if (ready(s)) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return s;
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("strata_tier_state_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

int32_t vocab_of(const std::string& name, ThreadPool& pool) {
  auto m = load_model(model_dir(name), pool);
  return m.ok() ? (*m)->config().vocab_size : 0;
}

bool hybrid(const std::string& name) { return name.rfind("qwen35", 0) == 0; }

// Tokens of `r` computed from nothing, by an engine with no tiers.
std::vector<int32_t> cold_tokens(const std::string& name, ThreadPool& pool, const GenerationRequest& r) {
  auto e = make_engine(name, pool, EngineOptions{});
  if (!e) return {};
  const Outcome o = run(*e, r);
  EXPECT_EQ(o.final.usage.cached_tokens, 0);
  return o.tokens;
}

class EngineTierStateTest : public ::testing::TestWithParam<std::string> {};

TEST_P(EngineTierStateTest, RestartServesThePromptAndTheNextTurnFromDisk) {
  const std::string name = GetParam();
  ThreadPool pool(2);
  const int32_t vocab = vocab_of(name, pool);
  ASSERT_GT(vocab, 3);
  const fs::path dir = fresh_dir(name + "_restart");
  EngineOptions o;
  o.kv_disk_dir = dir.string();
  const auto a = request("a", prompt_tokens(1, 300, vocab));
  const std::vector<int32_t> cold = cold_tokens(name, pool, a);
  ASSERT_EQ(cold.size(), 8u);
  {
    auto engine = make_engine(name, pool, o);
    ASSERT_TRUE(engine);
    const Outcome first = run(*engine, a);
    EXPECT_EQ(first.final.usage.cached_tokens, 0);
    EXPECT_EQ(first.tokens, cold);
    engine->shutdown();  // the pools' cached blocks and the snapshots go down to disk
  }
  ASSERT_TRUE(fs::exists(dir / (hybrid(name) ? "state" : "window")));
  // The next turn: the first turn's prompt and answer, then more.
  std::vector<int32_t> p2 = a.prompt;
  p2.insert(p2.end(), cold.begin(), cold.end());
  const std::vector<int32_t> more = prompt_tokens(2, 40, vocab);
  p2.insert(p2.end(), more.begin(), more.end());
  const auto b = request("b", p2);
  const std::vector<int32_t> cold_b = cold_tokens(name, pool, b);
  ASSERT_EQ(cold_b.size(), 8u);
  {
    auto engine = make_engine(name, pool, o);
    ASSERT_TRUE(engine);
    auto again = a;
    again.id = "a-after-restart";
    const Outcome warm = run(*engine, again);
    // The hybrid's hit ends at the last snapshot point before the prompt's last token (its
    // prefill chunk boundary); the windowed models' at the last full block before it.
    EXPECT_GE(warm.final.usage.cached_tokens, hybrid(name) ? 256 : 288) << name;
    EXPECT_EQ(warm.tokens, cold) << name;
    const EngineStats s = stats_when(*engine, [&](const EngineStats& t) { return t.kv_tiers.disk_hit_blocks > 0; });
    EXPECT_GE(s.kv_tiers.disk_hit_blocks, 16);
    if (hybrid(name)) {
      EXPECT_GE(s.state_tiers.disk_hit_blocks, 1);
      EXPECT_GE(s.state_snapshots.restores, 1);
    } else {
      EXPECT_GE(s.kv_window_tiers.disk_hit_blocks, 1);
    }
    const Outcome turn2 = run(*engine, b);
    EXPECT_GE(turn2.final.usage.cached_tokens, 256) << name;
    EXPECT_EQ(turn2.tokens, cold_b) << name;
  }
  fs::remove_all(dir);
}

TEST_P(EngineTierStateTest, EvictedCompanionsComeBackFromTheLowerTiers) {
  const std::string name = GetParam();
  ThreadPool pool(2);
  const int32_t vocab = vocab_of(name, pool);
  ASSERT_GT(vocab, 3);
  const fs::path dir = fresh_dir(name + "_evict");
  const auto a = request("a", prompt_tokens(3, 300, vocab)), b = request("b", prompt_tokens(4, 300, vocab)),
             c = request("c", prompt_tokens(5, 300, vocab));
  const std::vector<int32_t> cold = cold_tokens(name, pool, a);
  EngineOptions o;
  // Pools that hold about one 300-token prompt: running b and c evicts all of a's blocks (both
  // pools; the window pool keeps the newest of a's window blocks until c's take their place).
  o.kv_blocks = 24;
  if (!hybrid(name)) o.kv_window_blocks = 24;
  o.kv_host_bytes = int64_t(64) << 20;
  o.kv_disk_dir = dir.string();
  if (hybrid(name)) {
    // A store of one snapshot: b's drops a's, to disk.
    auto probe = make_engine(name, pool, EngineOptions{});
    ASSERT_TRUE(probe);
    run(*probe, a);
    const StateSnapshotStats p = stats_when(*probe, [](const EngineStats& t) { return t.state_snapshots.count > 0; }).state_snapshots;
    ASSERT_EQ(p.count, 1);
    o.state_snapshot_bytes = p.bytes;
  }
  auto engine = make_engine(name, pool, o);
  ASSERT_TRUE(engine);
  EXPECT_EQ(run(*engine, a).tokens, cold);
  run(*engine, b);
  run(*engine, c);
  ASSERT_TRUE(engine->flush_kv_tiers(30.0));
  auto again = a;
  again.id = "a-again";
  const Outcome warm = run(*engine, again);
  EXPECT_GE(warm.final.usage.cached_tokens, hybrid(name) ? 256 : 288) << name;
  EXPECT_EQ(warm.tokens, cold) << name;
  const EngineStats s = stats_when(*engine, [&](const EngineStats& t) { return t.kv_tiers.host_hit_blocks > 0; });
  EXPECT_GT(s.kv_tiers.host_hit_blocks, 0);
  if (hybrid(name)) {
    EXPECT_GE(s.state_snapshots.evictions, 1);
    EXPECT_GE(s.state_tiers.disk_hit_blocks, 1);
  } else {
    EXPECT_GT(s.kv_window_tiers.demoted_blocks, 0);
    EXPECT_GE(s.kv_window_tiers.host_hit_blocks, 1);
  }
  engine.reset();
  fs::remove_all(dir);
}

// The full pool keeps the prompt's blocks, the window pool does not: the hit takes its full
// blocks from the device and only the window blocks from the host tier.
TEST_P(EngineTierStateTest, WindowBlocksComeBackUnderCachedFullBlocks) {
  const std::string name = GetParam();
  if (hybrid(name)) GTEST_SKIP() << "no window layers";
  ThreadPool pool(2);
  const int32_t vocab = vocab_of(name, pool);
  const auto a = request("a", prompt_tokens(6, 300, vocab));
  const std::vector<int32_t> cold = cold_tokens(name, pool, a);
  EngineOptions o;
  o.kv_window_blocks = 24;
  o.kv_host_bytes = int64_t(64) << 20;
  auto engine = make_engine(name, pool, o);
  ASSERT_TRUE(engine);
  EXPECT_EQ(run(*engine, a).tokens, cold);
  for (int i = 7; i < 9; ++i) run(*engine, request("other", prompt_tokens(i, 300, vocab)));
  ASSERT_TRUE(engine->flush_kv_tiers(30.0));
  const int64_t host_hits = engine->stats().kv_tiers.host_hit_blocks;
  auto again = a;
  again.id = "a-again";
  const Outcome warm = run(*engine, again);
  EXPECT_GE(warm.final.usage.cached_tokens, 288) << name;
  EXPECT_EQ(warm.tokens, cold) << name;
  const EngineStats s = stats_when(*engine, [&](const EngineStats& t) { return t.kv_window_tiers.host_hit_blocks > 0; });
  EXPECT_GE(s.kv_window_tiers.host_hit_blocks, 1);
  EXPECT_EQ(s.kv_tiers.host_hit_blocks, host_hits) << "the full blocks were on the device";
}

INSTANTIATE_TEST_SUITE_P(Families, EngineTierStateTest, ::testing::Values("gemma3-tiny", "gemma4-tiny", "qwen35-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = (c == '-') ? '_' : c;
                           return n;
                         });

}  // namespace
}  // namespace strata
