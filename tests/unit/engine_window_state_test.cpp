// The engine with sliding-window layers (a KV pool of their own, blocks behind the window given
// back) and recurrent state (slots, snapshots at block boundaries, restore on prefix hits), on a
// fake model whose logits at position p are a function of the prompt's tokens only when every
// read is right: a full-attention layer reads (token, position) of [0, p] through block_table, a
// sliding layer reads [p - window + 1, p] through window_block_table (a -1 entry there fails the
// step), and a recurrent layer folds every token into its slot. The same function computed
// directly on the token vector gives the reference greedy tokens.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <chrono>
#include <thread>

#include "../support/engine_test_support.h"
#include "core/check.h"
#include "engine/engine.h"
#include "engine/scheduler.h"

namespace strata {
namespace {

using test::drain;
using test::Outcome;

constexpr int32_t kVocab = 64;

uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The recurrent layer's update; stays below 2^24 so a float slot holds it exactly.
uint64_t fold_state(uint64_t st, int32_t token, int32_t pos) {
  return (st * 31 + uint64_t(token) * 4099 + uint64_t(pos)) % 1000003;
}

uint64_t mix_key(uint64_t h, int32_t token, int32_t pos, uint64_t salt) {
  return mix(h ^ (uint64_t(token) * 131 + uint64_t(pos) + salt));
}

void logits_from_hash(uint64_t h, float* out) {
  for (int32_t v = 0; v < kVocab; ++v) out[v] = float(mix(h ^ uint64_t(v)) % 1000) / 100.0f;
}

// Layer 0 full attention, layer 1 sliding (window > 0), layer 2 recurrent (with_state).
class FakeModel final : public Model {
 public:
  FakeModel(ThreadPool& pool, int32_t window, bool with_state, std::chrono::microseconds step_time = {})
      : Model(make_config(), pool), window_(window), with_state_(with_state), step_time_(step_time) {}
  static ModelConfig make_config() {
    ModelConfig c;
    c.model_type = "fake";
    c.vocab_size = kVocab;
    c.n_layers = 3;
    c.max_position = 4096;
    c.eos_ids = {2};
    return c;
  }
  std::vector<KvLayerSpec> kv_layout() const override {
    std::vector<KvLayerSpec> v(3);
    for (auto& s : v) {
      s.n_kv_heads = 1;
      s.head_dim_k = 2;
      s.head_dim_v = 2;
    }
    v[1].window = window_;
    if (window_ == 0) v[1].has_kv = false;
    v[2].has_kv = false;
    return v;
  }
  std::vector<StateLayerSpec> state_layout() const override {
    std::vector<StateLayerSpec> v(3);
    if (with_state_) v[2] = StateLayerSpec{1, 1, true};
    return v;
  }
  void forward(const StepBatch& batch, KvStorage& kv, StateStorage* state, float* logits) override {
    if (step_time_.count() > 0) std::this_thread::sleep_for(step_time_);
    const int32_t bs = kv.block_size();
    auto slot_of = [&](const std::vector<int32_t>& table, int layer, int32_t p) {
      STRATA_CHECK(size_t(p / bs) < table.size(), "position past the block table");
      const int32_t block = table[size_t(p / bs)];
      STRATA_CHECK(block >= 0 && block < kv.n_blocks(layer), "read of a block the sequence does not hold");
      return kv.k_pool(layer) + (size_t(block) * size_t(bs) + size_t(p % bs)) * 2;
    };
    size_t t = 0;
    float* out = logits;
    for (const auto& s : batch.seqs) {
      if (with_state_) {
        STRATA_CHECK(state != nullptr && s.state_slot >= 0 && s.state_slot < state->n_slots(), "span without a slot");
        if (s.pos0 == 0) state->reset(s.state_slot);
      }
      const std::vector<int32_t>& wtable = s.window_block_table.empty() ? s.block_table : s.window_block_table;
      for (int32_t i = 0; i < s.n_tokens; ++i) {
        const int32_t p = s.pos0 + i;
        const int32_t tok = batch.tokens[t + size_t(i)];
        for (int layer : {0, 1}) {
          if (layer == 1 && window_ == 0) continue;
          float* slot = slot_of(layer == 0 ? s.block_table : wtable, layer, p);
          slot[0] = float(tok);
          slot[1] = float(p);
        }
      }
      for (int32_t i = 0; i < s.n_tokens; ++i) {
        const int32_t p = s.pos0 + i;
        uint64_t st = 0;
        if (with_state_) {
          float* rec = state->recurrent(2, s.state_slot);
          st = fold_state(uint64_t(rec[0]), batch.tokens[t + size_t(i)], p);
          rec[0] = float(st);
        }
        if (!(s.logits_all || (s.logits_last && i == s.n_tokens - 1))) continue;
        uint64_t h = 0;
        for (int32_t q = 0; q <= p; ++q) {
          const float* slot = slot_of(s.block_table, 0, q);
          h = mix_key(h, int32_t(slot[0]), int32_t(slot[1]), 0);
        }
        if (window_ > 0) {
          for (int32_t q = std::max(0, p - window_ + 1); q <= p; ++q) {
            const float* slot = slot_of(wtable, 1, q);
            h = mix_key(h, int32_t(slot[0]), int32_t(slot[1]), 7777);
          }
        }
        if (with_state_) h = mix(h ^ st);
        logits_from_hash(h, out);
        out += kVocab;
      }
      t += size_t(s.n_tokens);
    }
  }

  // What forward() computes when every read is right: the logits after tokens[0, p].
  void reference_logits(const std::vector<int32_t>& tokens, int32_t p, float* out) const {
    uint64_t h = 0, st = 0;
    for (int32_t q = 0; q <= p; ++q) h = mix_key(h, tokens[size_t(q)], q, 0);
    if (window_ > 0) {
      for (int32_t q = std::max(0, p - window_ + 1); q <= p; ++q) h = mix_key(h, tokens[size_t(q)], q, 7777);
    }
    if (with_state_) {
      for (int32_t q = 0; q <= p; ++q) st = fold_state(st, tokens[size_t(q)], q);
      h = mix(h ^ st);
    }
    logits_from_hash(h, out);
  }

 private:
  int32_t window_;
  bool with_state_;
  std::chrono::microseconds step_time_;  // a step's simulated duration
};

std::vector<int32_t> reference_greedy(const FakeModel& m, std::vector<int32_t> tokens, int32_t n) {
  std::vector<int32_t> out;
  float l[kVocab];
  for (int32_t i = 0; i < n; ++i) {
    m.reference_logits(tokens, int32_t(tokens.size()) - 1, l);
    const int32_t next = int32_t(std::max_element(l, l + kVocab) - l);  // lowest id on ties
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

GenerationRequest greedy_request(const std::string& id, int32_t n_prompt, uint64_t salt, int32_t max_tokens) {
  GenerationRequest r;
  r.id = id;
  for (int32_t i = 0; i < n_prompt; ++i) r.prompt.push_back(int32_t(3 + mix(salt * 1000 + uint64_t(i)) % 60));
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  r.sampling.temperature = 0.0f;
  return r;
}

// Prompts of many lengths, some sharing long prefixes (prefix hits at several depths).
std::vector<GenerationRequest> workload() {
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 10; ++i) reqs.push_back(greedy_request("r" + std::to_string(i), 1 + (i * 23) % 90, uint64_t(i + 1), 4 + i % 7));
  for (int i : {2, 5}) {
    auto r = reqs[size_t(i)];
    r.id += "-turn2";
    r.prompt.resize(std::max<size_t>(r.prompt.size(), 60), 9);
    r.prompt.push_back(11);
    reqs.push_back(r);
    auto again = reqs[size_t(i)];
    again.id += "-again";
    reqs.push_back(again);
  }
  return reqs;
}

struct Config {
  int32_t budget, blocks, window_blocks, max_seqs;
  bool prefix;
};

void run_workload(int32_t window, bool with_state, const Config& c) {
  ThreadPool pool(1);
  auto model = std::make_unique<FakeModel>(pool, window, with_state);
  const FakeModel* raw = model.get();
  EngineOptions o;
  o.kv_blocks = c.blocks;
  o.kv_window_blocks = c.window_blocks;
  o.block_size = 4;
  o.max_batch_tokens = c.budget;
  o.max_num_seqs = c.max_seqs;
  o.prefix_caching = c.prefix;
  o.state_snapshot_interval = 16;
  auto e = Engine::create(std::move(model), o);
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  Engine& engine = **e;
  engine.start();
  const std::string label = "window " + std::to_string(window) + " state " + std::to_string(with_state) + " budget " +
                            std::to_string(c.budget) + " blocks " + std::to_string(c.blocks) + "/" +
                            std::to_string(c.window_blocks) + " prefix " + std::to_string(c.prefix);
  // Two waves: the second finds the first's blocks and snapshots in the cache.
  for (int wave = 0; wave < 2; ++wave) {
    std::vector<std::pair<GenerationRequest, std::shared_ptr<RequestStream>>> live;
    for (auto r : workload()) {
      r.id += "-w" + std::to_string(wave);
      auto s = engine.submit(r);
      ASSERT_TRUE(s.ok()) << s.error().to_string();
      live.emplace_back(r, *s);
    }
    for (auto& [r, s] : live) {
      auto out = drain(*s);
      EXPECT_EQ(out.tokens, reference_greedy(*raw, r.prompt, r.max_tokens)) << r.id << ": " << label;
      EXPECT_EQ(out.final.finish_reason, FinishReason::kLength) << r.id << ": " << out.final.message;
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const auto st = engine.stats();
  EXPECT_EQ(st.kv.used, 0) << label;
  EXPECT_EQ(st.kv.free + st.kv.cached, c.blocks) << label;
  if (window > 0) {
    EXPECT_EQ(st.kv_window.used, 0) << label;
    EXPECT_EQ(st.kv_window.n_blocks, engine.n_kv_window_blocks()) << label;
    EXPECT_EQ(st.kv_window.free + st.kv_window.cached, engine.n_kv_window_blocks()) << label;
  } else {
    EXPECT_EQ(st.kv_window.n_blocks, 0) << label;
  }
  if (c.prefix) {
    EXPECT_GT(st.prefix_hit_tokens, 0) << label;
  } else {
    EXPECT_EQ(st.prefix_hit_tokens, 0) << label;
  }
  if (with_state && c.prefix) {
    EXPECT_GT(st.state_snapshots.stores, 0) << label;
    EXPECT_GT(st.state_snapshots.restores, 0) << label;
  }
}

const Config kConfigs[] = {
    {512, 512, 0, 64, true},   // everything at once
    {512, 512, 0, 64, false},
    {7, 512, 0, 64, true},     // chunked prefill, mixed steps
    {13, 40, 0, 6, true},      // small pool: preemption
    {13, 40, 12, 6, true},     // small window pool
    {16, 30, 9, 64, false},
};

TEST(EngineWindow, SlidingLayersMatchTheReferenceUnderAnyBudgetPoolAndCache) {
  for (const Config& c : kConfigs) run_workload(/*window=*/6, /*with_state=*/false, c);
}

TEST(EngineWindow, WindowOfOneBlockAndLongerThanThePrompts) {
  for (const Config& c : {kConfigs[2], kConfigs[3]}) {
    run_workload(4, false, c);
    run_workload(200, false, c);
  }
}

TEST(EngineState, RecurrentStateMatchesTheReferenceUnderAnyBudgetPoolAndCache) {
  for (const Config& c : kConfigs) run_workload(/*window=*/0, /*with_state=*/true, c);
}

TEST(EngineState, WindowAndStateTogether) {
  for (const Config& c : kConfigs) run_workload(6, true, c);
}

TEST(EngineWindow, LongSequenceHoldsOnlyItsWindowInTheSlidingPool) {
  ThreadPool pool(1);
  EngineOptions o;
  o.kv_blocks = 200;
  o.block_size = 4;
  o.max_batch_tokens = 32;
  o.max_num_seqs = 4;
  o.prefix_caching = false;
  // Steps of 1 ms keep the sequence decoding while the stats are read: without it the whole
  // generation can end before the first read, which then sees empty pools.
  auto e = Engine::create(std::make_unique<FakeModel>(pool, 10, false, std::chrono::milliseconds(1)), o);
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  Engine& engine = **e;
  EXPECT_GT(engine.n_kv_window_blocks(), 0);
  EXPECT_LT(engine.n_kv_window_blocks(), engine.n_kv_blocks());
  engine.start();
  auto s = engine.submit(greedy_request("long", 300, 5, 400));
  ASSERT_TRUE(s.ok());
  // Watch the pools while the sequence decodes past 300 tokens.
  int32_t max_window_used = 0, max_full_used = 0;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE((*s)->next(std::chrono::seconds(20)).has_value());
    const auto st = engine.stats();
    max_window_used = std::max(max_window_used, st.kv_window.used);
    max_full_used = std::max(max_full_used, st.kv.used);
  }
  EXPECT_GE(max_full_used, 300 / 4);
  // Window 10 over blocks of 4: at most 4 blocks under the window plus the block being written.
  EXPECT_GT(max_window_used, 0);
  EXPECT_LE(max_window_used, 5);
  engine.cancel("long");
  (void)drain(**s);
}

TEST(EngineState, SnapshotsLieOnBoundariesAndChunksEndThere) {
  KvCacheManager kv(64, 4);
  StateSnapshotStore snaps(1 << 20);
  SchedulerOptions so;
  so.max_batch_tokens = 100;
  so.max_num_seqs = 4;
  so.prefix_salt = prefix_namespace_salt("t");
  so.n_state_slots = 4;
  so.state_snapshot_interval = 8;
  Scheduler sched(so, kv, std::make_unique<FcfsPolicy>(), nullptr, &snaps);
  Sequence a;
  a.id = 1;
  a.tokens.resize(22);
  for (int32_t i = 0; i < 22; ++i) a.tokens[size_t(i)] = i + 3;
  a.n_prompt = 22;
  sched.add(&a);
  std::vector<std::pair<int32_t, int32_t>> spans;  // (pos0, end)
  std::vector<int32_t> saves;
  for (int step = 0; step < 6 && a.n_computed < 22; ++step) {
    auto plan = sched.schedule(0.0);
    ASSERT_EQ(plan.spans.size(), 1u);
    const auto& sp = plan.spans[0];
    EXPECT_GE(a.state_slot, 0);
    spans.emplace_back(sp.pos0, sp.pos0 + sp.n_tokens);
    if (sp.save_state) saves.push_back(sp.pos0 + sp.n_tokens);
    sched.commit(sp);
  }
  // Every 8 tokens, and the prompt's last block boundary (20 = 22 rounded down to blocks of 4).
  EXPECT_EQ(spans, (std::vector<std::pair<int32_t, int32_t>>{{0, 8}, {8, 16}, {16, 20}, {20, 22}}));
  EXPECT_EQ(saves, (std::vector<int32_t>{8, 16, 20}));
  sched.finish(&a, 0.0);
  EXPECT_EQ(sched.state_slots().n_free(), 4);
}

// A model that only declares a KV layout.
class LayoutOnly final : public Model {
 public:
  LayoutOnly(ThreadPool& pool, std::vector<KvLayerSpec> layout)
      : Model(FakeModel::make_config(), pool), layout_(std::move(layout)) {}
  std::vector<KvLayerSpec> kv_layout() const override { return layout_; }
  void forward(const StepBatch&, KvStorage&, StateStorage*, float*) override {}

 private:
  std::vector<KvLayerSpec> layout_;
};

KvLayerSpec kv_spec(int32_t window, int32_t shares_with) {
  KvLayerSpec s;
  s.n_kv_heads = 1;
  s.head_dim_k = 2;
  s.head_dim_v = 2;  // 16 bytes a token
  s.window = window;
  s.shares_with = shares_with;
  return s;
}

// Layers reading an earlier layer's KV (Gemma 4's shared layers) take no bytes: the budget
// goes to the owners, the window pool first, the full pool the rest.
TEST(EngineWindow, SharedLayersAllocateNothing) {
  ThreadPool pool(1);
  EngineOptions o;
  o.block_size = 4;
  o.kv_window_blocks = 10;
  o.kv_cache_bytes = 16 * 4 * 10 + 16 * 4 * 50;
  auto e = Engine::create(std::make_unique<LayoutOnly>(pool, std::vector<KvLayerSpec>{kv_spec(0, -1), kv_spec(8, -1),
                                                                                         kv_spec(0, 0), kv_spec(8, 1)}),
                          o);
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  EXPECT_EQ((*e)->n_kv_blocks(), 50);
  EXPECT_EQ((*e)->n_kv_window_blocks(), 10);
}

TEST(EngineWindow, RefusesSharingAcrossAttentionKinds) {
  ThreadPool pool(1);
  // A full layer reading a sliding layer's KV.
  auto e = Engine::create(std::make_unique<LayoutOnly>(pool, std::vector<KvLayerSpec>{kv_spec(0, -1), kv_spec(8, -1),
                                                                                         kv_spec(0, 1)}),
                          EngineOptions{});
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(e.error().message.find("layer 2"), std::string::npos) << e.error().message;

  EngineOptions bad;
  bad.block_size = 16;
  bad.state_snapshot_interval = 500;
  auto s = Engine::create(std::make_unique<FakeModel>(pool, 0, true), bad);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("state_snapshot_interval"), std::string::npos) << s.error().message;
  EXPECT_NE(s.error().message.find("500"), std::string::npos) << s.error().message;
  EngineOptions tiny;
  tiny.kv_blocks = 64;
  tiny.block_size = 4;
  tiny.kv_window_blocks = 2;
  auto w = Engine::create(std::make_unique<FakeModel>(pool, 10, false), tiny);
  ASSERT_FALSE(w.ok());
  EXPECT_NE(w.error().message.find("kv_window_blocks 2"), std::string::npos) << w.error().message;
}

}  // namespace
}  // namespace strata
