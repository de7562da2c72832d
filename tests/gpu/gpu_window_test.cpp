// Sliding-window KV paging on the GPU (CudaEngineOptions::window_paging): the window layers of
// gemma2-tiny, gemma3-tiny and gemma4-tiny (window 16) page in a pool of their own through the
// engine as on the CPU. Against the GPU engine that keeps full KV for every layer, with
// batch-invariant kernels on both (CudaModelOptions::deterministic), long greedy generations
// many windows past their prompts give the same tokens; a window pool of a few blocks per
// sequence serves them (blocks behind every window go back: the pool's used count stays at a
// window's blocks per sequence while the full pool's grows); a prefix hit gives the tokens of
// the cold run. Then the KV held by one 32k-token sequence of a config shaped like
// Gemma-3-4B's attention (34 layers, 5 sliding : 1 full, window 1024, 4 KV heads x 256; small
// hidden size and vocabulary, weights drawn on the device) with and without window paging is
// printed. Needs a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "../support/stream_test_support.h"
#include "engine/engine.h"
#include "gpu_test_util.h"
#include "runtime/cuda/cuda_executor.h"

namespace strata::cuda {
namespace {

using test::drain;
using test::greedy_request;
using test::Outcome;
using test::random_ids;

using namespace strata::gpu_test;

constexpr int32_t kBlock = 16;

struct PoolSetup {
  bool paging = true;
  int32_t window_blocks = 0;  // CudaEngineOptions::kv_window_blocks
  int32_t max_batch_tokens = 48;
  int32_t max_num_seqs = 4;
  int32_t max_model_len = 512;
  int64_t kv_bytes = int64_t(32) << 20;
  bool random_weights = false;
  int64_t kv_host_bytes = 0;  // EngineOptions::kv_host_bytes
  std::string kv_disk_dir;    // EngineOptions::kv_disk_dir
};

struct Started {
  std::unique_ptr<Engine> engine;
  int64_t block_bytes = 0;         // one full-pool block
  int64_t window_block_bytes = 0;  // one window-pool block
};

Started start(const std::string& dir, const std::string& name, const PoolSetup& s) {
  CudaEngineOptions o;
  o.kv_cache_bytes = s.kv_bytes;
  o.block_size = kBlock;
  o.max_batch_tokens = s.max_batch_tokens;
  o.max_num_seqs = s.max_num_seqs;
  o.max_model_len = s.max_model_len;
  o.deterministic = true;
  o.window_paging = s.paging;
  o.kv_window_blocks = s.window_blocks;
  o.random_weights = s.random_weights;
  Started out;
  auto parts = make_cuda_engine_parts(dir, o);
  EXPECT_TRUE(parts.ok()) << (parts.ok() ? "" : parts.error().to_string());
  if (!parts.ok()) return out;
  const KvPoolLayout& l = parts->executor->decoder().kv_pool().layout();
  out.block_bytes = l.bytes_per_block();
  out.window_block_bytes = l.window_bytes_per_block();
  const int32_t window_blocks = parts->executor->n_kv_window_blocks();
  EXPECT_EQ(window_blocks > 0, s.paging) << name << ": the window layers page apart exactly when asked";
  if (s.window_blocks > 0 && s.paging) {
    EXPECT_EQ(window_blocks, s.window_blocks);
  }
  EngineOptions eo;
  eo.block_size = kBlock;
  eo.max_batch_tokens = s.max_batch_tokens;
  eo.max_num_seqs = s.max_num_seqs;
  eo.max_model_len = s.max_model_len;
  eo.max_queued = 64;
  eo.kv_codecs = parts->kv_codecs;
  eo.model_identity = name;
  eo.kv_host_bytes = s.kv_host_bytes;
  eo.kv_disk_dir = s.kv_disk_dir;
  auto e = Engine::create(std::move(parts->shape), eo, std::move(parts->executor));
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  if (!e.ok()) return out;
  EXPECT_EQ((*e)->n_kv_window_blocks(), window_blocks) << "the engine plans with the device's window pool";
  (*e)->start();
  out.engine = std::move(e).value();
  return out;
}

// Peak blocks in use of each pool while a request's stream is read (stats after each event).
struct Peaks {
  int32_t full = 0, window = 0;
  void see(const EngineStats& s) {
    full = std::max(full, s.kv.used);
    window = std::max(window, s.kv_window.used);
  }
};

Outcome drain_watching(Engine& e, RequestStream& s, Peaks* peaks) {
  Outcome o;
  for (;;) {
    auto ev = s.next(std::chrono::seconds(300));
    if (!ev) {
      ADD_FAILURE() << "request " << s.id() << " timed out";
      return o;
    }
    peaks->see(e.stats());
    o.tokens.insert(o.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    if (ev->final) {
      o.final = *ev;
      return o;
    }
  }
}

class GpuWindow : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  }
};

// Four sequences at once, prompts of 21..70 tokens chunked by a 48-token step budget, 300 greedy
// tokens each (about 19 windows past the prompt); the paged engine's window pool holds only 16
// blocks (a window takes 2 blocks at block size 16, plus the block being written): without
// returned blocks the four sequences (24 blocks each at the end) could not run together.
TEST_P(GpuWindow, LongGenerationsMatchFullKvWithBlocksReturned) {
  const std::string name = GetParam();
  const std::string dir = model_path(name);
  constexpr int32_t kGen = 300, kWindowPool = 16;
  PoolSetup paged;
  paged.window_blocks = kWindowPool;
  PoolSetup full;
  full.paging = false;
  Started a = start(dir, name, paged);
  Started b = start(dir, name, full);
  ASSERT_NE(a.engine, nullptr);
  ASSERT_NE(b.engine, nullptr);
  ASSERT_GT(a.window_block_bytes, 0);
  EXPECT_EQ(b.window_block_bytes, 0);
  EXPECT_LT(a.block_bytes, b.block_bytes) << "the full pool's blocks hold the full-attention layers only";
  const int32_t vocab = 512;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_ids(100 + i, 21 + 17 * i, vocab));
  std::vector<std::vector<int32_t>> tokens[2];
  Peaks peaks[2];
  for (int k = 0; k < 2; ++k) {
    Engine& e = *(k == 0 ? a.engine : b.engine);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto s = e.submit(greedy_request(name + "-long-" + std::to_string(i), prompts[i], kGen));
      ASSERT_TRUE(s.ok()) << s.error().to_string();
      streams.push_back(*s);
    }
    for (auto& s : streams) {
      Outcome o = drain_watching(e, *s, &peaks[k]);
      ASSERT_EQ(int32_t(o.tokens.size()), kGen) << o.final.message;
      tokens[k].push_back(o.tokens);
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(tokens[0][i], tokens[1][i]) << name << " sequence " << i << ": window paging changed the greedy tokens";
  }
  // The window pool never held more than its 16 blocks while the full pool held every position.
  const EngineStats sa = a.engine->stats();
  EXPECT_EQ(sa.kv_window.n_blocks, kWindowPool);
  EXPECT_LE(peaks[0].window, kWindowPool);
  EXPECT_GE(peaks[0].full, (21 + kGen) / kBlock) << "the full pool holds each sequence's every block";
  EXPECT_EQ(sa.kv_window.used, 0) << "no window block stays referenced after the requests end";
  EXPECT_EQ(sa.kv_window.free + sa.kv_window.cached, sa.kv_window.n_blocks);
  std::printf("%s: peak blocks in use, paged: full %d + window %d (of %d); unpaged: %d\n", name.c_str(), peaks[0].full,
              peaks[0].window, kWindowPool, peaks[1].full);

  std::printf("%s: %lld preemptions in the paged run\n", name.c_str(), (long long)sa.preemptions);

  // A prefix hit on both engines: a prompt runs, then the same prompt with a new tail reuses its
  // blocks (both pools'); the paged engine's tokens equal the unpaged engine's, and the hit's
  // equal a cold run of the longer prompt.
  const std::vector<int32_t> first = random_ids(500, 70, vocab);
  std::vector<int32_t> again = first;
  const std::vector<int32_t> tail = random_ids(999, 9, vocab);
  again.insert(again.end(), tail.begin(), tail.end());
  std::vector<int32_t> hit[2];
  for (int k = 0; k < 2; ++k) {
    Engine& e = *(k == 0 ? a.engine : b.engine);
    auto s0 = e.submit(greedy_request(name + "-prefix", first, 8));
    ASSERT_TRUE(s0.ok()) << s0.error().to_string();
    ASSERT_EQ(drain(**s0).tokens.size(), 8u);
    const int64_t before = e.stats().prefix_hit_tokens;
    auto s = e.submit(greedy_request(name + "-hit", again, 64));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    Outcome o = drain(**s);
    ASSERT_EQ(o.tokens.size(), 64u) << o.final.message;
    EXPECT_GE(e.stats().prefix_hit_tokens - before, 64) << (k == 0 ? "paged" : "unpaged") << ": the prompt's blocks are reused";
    hit[k] = o.tokens;
  }
  EXPECT_EQ(hit[0], hit[1]) << name << ": a prefix hit with window paging differs from full KV";
  PoolSetup cold_setup = paged;
  Started cold = start(dir, name, cold_setup);
  ASSERT_NE(cold.engine, nullptr);
  auto s = cold.engine->submit(greedy_request(name + "-cold", again, 64));
  ASSERT_TRUE(s.ok()) << s.error().to_string();
  Outcome o = drain(**s);
  EXPECT_EQ(cold.engine->stats().prefix_hit_tokens, 0);
  EXPECT_EQ(o.tokens, hit[0]) << name << ": the prefix hit differs from the cold run";
  a.engine->shutdown();
  b.engine->shutdown();
  cold.engine->shutdown();
}

// The window pool's blocks in the host and disk tiers (read from and written to the device): a
// 300-token prompt runs, two others push its blocks out of the window pool (24 blocks), and
// the prompt again takes its full blocks from the device and its window blocks from the host
// tier (the hit reaches past the last window); after a restart both come from disk. Every run
// gives the first run's tokens (batch-invariant kernels).
TEST_P(GpuWindow, EvictedAndRestartedWindowBlocksComeBackFromTheTiers) {
  const std::string name = GetParam();
  const std::string dir = model_path(name);
  const std::filesystem::path disk = std::filesystem::temp_directory_path() / ("strata_gpu_window_tiers_" + name);
  std::filesystem::remove_all(disk);
  PoolSetup s;
  s.window_blocks = 24;
  s.kv_host_bytes = int64_t(64) << 20;
  s.kv_disk_dir = disk.string();
  const int32_t vocab = 512;
  const auto a = random_ids(31, 300, vocab), b = random_ids(32, 300, vocab), c = random_ids(33, 300, vocab);
  std::vector<int32_t> first;
  {
    Started st = start(dir, name, s);
    ASSERT_NE(st.engine, nullptr);
    // The full pool holds all four prompts: the hit takes the full blocks from the device and
    // the window blocks from the host tier.
    Outcome o = drain(**st.engine->submit(greedy_request(name + "-a", a, 8)));
    ASSERT_EQ(o.tokens.size(), 8u) << o.final.message;
    first = o.tokens;
    for (const auto* p : {&b, &c}) {
      ASSERT_EQ(drain(**st.engine->submit(greedy_request(name + "-bc", *p, 8))).tokens.size(), 8u);
    }
    ASSERT_TRUE(st.engine->flush_kv_tiers(30.0));
    EXPECT_GT(st.engine->stats().kv_window_tiers.demoted_blocks, 0);
    Outcome again = drain(**st.engine->submit(greedy_request(name + "-a-again", a, 8)));
    EXPECT_GE(again.final.usage.cached_tokens, 288) << name;
    EXPECT_EQ(again.tokens, first) << name << ": a hit through the window tier differs from the cold run";
    const EngineStats t = st.engine->stats();
    EXPECT_GE(t.kv_window_tiers.host_hit_blocks, 1) << name;
    std::printf("%s: window tier demoted %lld blocks, host hits %lld\n", name.c_str(), (long long)t.kv_window_tiers.demoted_blocks,
                (long long)t.kv_window_tiers.host_hit_blocks);
    st.engine->shutdown();
  }
  Started st = start(dir, name, s);
  ASSERT_NE(st.engine, nullptr);
  Outcome o = drain(**st.engine->submit(greedy_request(name + "-a-restart", a, 8)));
  EXPECT_GE(o.final.usage.cached_tokens, 288) << name;
  EXPECT_EQ(o.tokens, first) << name << ": a hit from disk after a restart differs from the cold run";
  const EngineStats t = st.engine->stats();
  EXPECT_GE(t.kv_tiers.disk_hit_blocks, 16) << name;
  EXPECT_GE(t.kv_window_tiers.disk_hit_blocks, 1) << name;
  st.engine->shutdown();
  std::filesystem::remove_all(disk);
}

INSTANTIATE_TEST_SUITE_P(Families, GpuWindow, ::testing::Values("gemma2-tiny", "gemma3-tiny", "gemma4-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

// The KV one 32k-token sequence holds, with and without window paging, in a config with
// Gemma-3-4B's attention shape (KV bytes depend on nothing else).
TEST(GpuWindowMemory, Gemma3Shaped32kSequence) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "strata_gpu_window_gemma3_shape";
  std::filesystem::create_directories(dir);
  nlohmann::json cfg = nlohmann::json::parse(std::ifstream(model_path("gemma3-tiny") + "/config.json"));
  cfg["num_hidden_layers"] = 34;
  cfg["num_attention_heads"] = 8;
  cfg["num_key_value_heads"] = 4;
  cfg["head_dim"] = 256;
  cfg["query_pre_attn_scalar"] = 256;
  cfg["sliding_window"] = 1024;
  cfg["hidden_size"] = 256;
  cfg["intermediate_size"] = 512;
  cfg["vocab_size"] = 4096;
  cfg["max_position_embeddings"] = 131072;
  cfg["tie_word_embeddings"] = true;
  nlohmann::json types = nlohmann::json::array();
  for (int l = 0; l < 34; ++l) types.push_back(l % 6 == 5 ? "full_attention" : "sliding_attention");
  cfg["layer_types"] = types;
  std::ofstream(dir / "config.json") << cfg.dump(2);

  constexpr int32_t kPrompt = 32768;
  PoolSetup s;
  s.random_weights = true;
  s.max_batch_tokens = 4096;
  s.max_num_seqs = 2;
  s.max_model_len = kPrompt + 64;
  s.kv_bytes = int64_t(6) << 30;
  const std::vector<int32_t> prompt = random_ids(7, kPrompt, 4096);
  int64_t held[2] = {0, 0};
  for (int k = 0; k < 2; ++k) {
    s.paging = k == 0;
    Started st = start(dir.string(), "gemma3-shape", s);
    ASSERT_NE(st.engine, nullptr);
    Peaks p;
    auto r = st.engine->submit(greedy_request("long", prompt, 8));
    ASSERT_TRUE(r.ok()) << r.error().to_string();
    Outcome o = drain_watching(*st.engine, **r, &p);
    ASSERT_EQ(o.tokens.size(), 8u) << o.final.message;
    held[k] = int64_t(p.full) * st.block_bytes + int64_t(p.window) * st.window_block_bytes;
    std::printf("gemma3-shaped (34 layers, window 1024, 4 KV heads x 256), one sequence of %d + 8 tokens, %s: %d full blocks "
                "x %lld B + %d window blocks x %lld B = %.1f MiB\n",
                kPrompt, k == 0 ? "window paging" : "full KV in every layer", p.full, (long long)st.block_bytes, p.window,
                (long long)st.window_block_bytes, double(held[k]) / (1 << 20));
    EXPECT_GE(p.full, kPrompt / kBlock);
    if (k == 0) {
      EXPECT_LE(p.window, 1024 / kBlock + 2 + s.max_batch_tokens / kBlock) << "a window and a step's blocks";
    }
    st.engine->shutdown();
  }
  EXPECT_LT(held[0], held[1]);
  std::printf("gemma3-shaped 32k sequence: window paging holds %.3f of full KV\n", double(held[0]) / double(held[1]));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace strata::cuda
