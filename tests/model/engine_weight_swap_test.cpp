// Persisted state follows the weights, not the path: a random-weight checkpoint is served with
// a disk KV tier, other weights of the same shape replace it at the same path, and the restarted
// engine reports no cached tokens and answers with the new weights' cold tokens (keyed by the
// path alone, as before the state identity, the same restart reports the prompt cached). The
// same weights restarted hit the disk tier. Another KV codec or block size over the same
// directory is served cold too. A checkpoint written by other weights is skipped (counted) and
// its request runs cold with the new weights' tokens; under the same weights it resumes.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "../support/engine_test_support.h"
#include "../support/test_dir.h"
#include "engine/state_identity.h"
#include "model/synthetic_checkpoint.h"

namespace strata {
namespace {

using namespace strata::test;
namespace fs = std::filesystem;

constexpr int32_t kVocab = 512;

class EngineWeightSwapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = strata::test::fresh_test_dir("strata_weight_swap");
    model_ = root_ / "model";
    kv_ = root_ / "kv";
  }
  void TearDown() override { fs::remove_all(root_); }

  // Random weights of one fixed (tiny, f32) shape at model_; only the seed differs.
  void write_weights(uint64_t seed) {
    SyntheticModelSpec s;
    s.vocab_size = kVocab;
    s.hidden = 64;
    s.n_layers = 2;
    s.n_heads = 4;
    s.n_kv_heads = 2;
    s.head_dim = 16;
    s.intermediate = 128;
    s.max_position = 4096;
    s.dtype = DType::kF32;
    s.init_std = 0.1f;
    s.seed = seed;
    // A restart with other weights is never within one tick of the coarse timestamp clock.
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ASSERT_TRUE(write_synthetic_checkpoint(model_.string(), s).ok());
  }

  // The identity strata serve gives this model with a disk tier or checkpoints.
  std::string identity() const {
    StateIdentitySource s;
    s.model_dir = model_.string();
    s.backend = backend_numeric_identity("cpu", KvCodecConfig{}, false);
    s.persistent = true;
    s.hash_cache_dir = kv_.string();
    return state_identity(s);
  }

  // A small pool: the default's 512 MiB would cost more to allocate than this model to run.
  static EngineOptions small() {
    EngineOptions o;
    o.kv_blocks = 128;
    return o;
  }

  EngineOptions tiered() const {
    EngineOptions o = small();
    o.kv_disk_dir = kv_.string();
    o.kv_disk_bytes = int64_t(1) << 30;
    return o;
  }

  std::unique_ptr<Engine> engine(EngineOptions o, const std::string& id) {
    auto m = load_model(model_.string(), pool_);
    EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().to_string());
    if (!m.ok()) return nullptr;
    return start_engine(std::move(m).value(), std::move(o), id);
  }

  // The model now at model_, on an engine with neither tiers nor checkpoints.
  Outcome cold(const GenerationRequest& r, EngineOptions o = small()) {
    auto e = engine(std::move(o), "cold");
    if (!e) return {};
    return run(*e, r);
  }

  // Runs r on an engine over the tier directory, then shuts it down (the pool's blocks go to disk).
  Outcome run_and_restart(const GenerationRequest& r, EngineOptions o, const std::string& id, KvTierStats* stats = nullptr) {
    auto e = engine(std::move(o), id);
    if (!e) return {};
    Outcome out = run(*e, r);
    if (stats != nullptr) *stats = e->stats().kv_tiers;
    e->shutdown();
    return out;
  }

  fs::path root_, model_, kv_;
  ThreadPool pool_{2};
};

GenerationRequest prompt_request(const std::string& id) {
  return greedy_request(id, random_ids(11, 200, kVocab), 16);  // 12 full blocks of 16
}

TEST_F(EngineWeightSwapTest, OtherWeightsAtTheSamePathAreServedCold) {
  const auto r = prompt_request("a");
  write_weights(1);
  const std::string id_a = identity();
  const Outcome cold_a = run_and_restart(r, tiered(), id_a);
  ASSERT_EQ(cold_a.tokens.size(), 16u);
  EXPECT_EQ(cold_a.final.usage.cached_tokens, 0);

  // The same weights after a restart: the prompt comes from the disk tier.
  EXPECT_EQ(identity(), id_a);
  KvTierStats st;
  const Outcome warm_a = run_and_restart(r, tiered(), id_a, &st);
  EXPECT_GE(warm_a.final.usage.cached_tokens, 192);
  EXPECT_EQ(warm_a.tokens, cold_a.tokens);
  EXPECT_GT(st.disk_hit_blocks, 0);

  // Other weights of the same shape at the same path.
  write_weights(2);
  const Outcome cold_b = cold(r);
  ASSERT_NE(cold_b.tokens, cold_a.tokens) << "the two seeds must give other tokens for this test to mean anything";
  const std::string id_b = identity();
  EXPECT_NE(id_b, id_a);
  const Outcome after_swap = run_and_restart(r, tiered(), id_b, &st);
  EXPECT_EQ(after_swap.final.usage.cached_tokens, 0);
  EXPECT_EQ(after_swap.tokens, cold_b.tokens);
  EXPECT_EQ(st.disk_hit_blocks, 0);
  EXPECT_GT(st.disk.quarantined_files, 0);  // A's files are foreign to B
  // And B's own state is a hit on B's next restart.
  const Outcome warm_b = run_and_restart(r, tiered(), id_b);
  EXPECT_GE(warm_b.final.usage.cached_tokens, 192);
  EXPECT_EQ(warm_b.tokens, cold_b.tokens);
}

// What the identity fixes: keyed by the path, as strata serve keyed it, the swapped weights are
// answered from the old model's KV.
TEST_F(EngineWeightSwapTest, KeyedByThePathTheSwapIsServedTheOldKv) {
  const auto r = prompt_request("a");
  const std::string by_path = fs::absolute(model_).lexically_normal().string();
  write_weights(1);
  const Outcome cold_a = run_and_restart(r, tiered(), by_path);
  write_weights(2);
  const Outcome cold_b = cold(r);
  ASSERT_NE(cold_b.tokens, cold_a.tokens);
  const Outcome stale = run_and_restart(r, tiered(), by_path);
  EXPECT_GE(stale.final.usage.cached_tokens, 192);
  EXPECT_NE(stale.tokens, cold_b.tokens);
}

TEST_F(EngineWeightSwapTest, AnotherCodecOrBlockSizeOverTheDirectoryIsServedCold) {
  const auto r = prompt_request("a");
  write_weights(1);
  const std::string id = identity();
  run_and_restart(r, tiered(), id);

  EngineOptions int8 = tiered();
  int8.kv_codecs.default_spec.codec = KvCodec::kInt8;
  EngineOptions cold_int8 = small();
  cold_int8.kv_codecs = int8.kv_codecs;
  const Outcome want_int8 = cold(r, cold_int8);
  KvTierStats st;
  const Outcome got_int8 = run_and_restart(r, int8, id, &st);
  EXPECT_EQ(got_int8.final.usage.cached_tokens, 0);
  EXPECT_EQ(got_int8.tokens, want_int8.tokens);
  EXPECT_EQ(st.disk_hit_blocks, 0);

  EngineOptions big_blocks = tiered();
  big_blocks.block_size = 32;
  EngineOptions cold_big = small();
  cold_big.block_size = 32;
  const Outcome want_big = cold(r, cold_big);
  const Outcome got_big = run_and_restart(r, big_blocks, id, &st);
  EXPECT_EQ(got_big.final.usage.cached_tokens, 0);
  EXPECT_EQ(got_big.tokens, want_big.tokens);
  EXPECT_EQ(st.disk_hit_blocks, 0);

  // A tier opened under another layout quarantines the files it cannot use, so the first
  // layout's blocks are gone by now: it runs cold, with its cold tokens.
  const Outcome again = run_and_restart(r, tiered(), id);
  EXPECT_EQ(again.tokens, cold(r).tokens);
}

class EngineWeightSwapCheckpointTest : public EngineWeightSwapTest {
 protected:
  EngineOptions checkpointed() const {
    EngineOptions o = tiered();
    o.checkpoint_every = 8;
    return o;
  }
  // Runs r until 20 tokens were streamed, then stops the engine mid-generation (a crash for
  // the request: its checkpoint stays).
  void crash(const GenerationRequest& r, const std::string& id) {
    auto e = engine(checkpointed(), id);
    ASSERT_TRUE(e);
    auto s = e->submit(r);
    ASSERT_TRUE(s.ok());
    size_t seen = 0;
    while (seen < 20) {
      auto ev = (*s)->next(std::chrono::seconds(300));
      ASSERT_TRUE(ev && !ev->final) << "the request ended before the simulated crash";
      seen += ev->tokens.size();
    }
    EXPECT_TRUE(e->flush_kv_tiers(30.0));
    e->shutdown();
    ASSERT_FALSE(fs::is_empty(kv_ / "checkpoints"));
  }
  // Runs r to its end; the size of its first event (a resume sends the checkpointed tokens at once).
  std::pair<Outcome, size_t> resume(const GenerationRequest& r, const std::string& id, int64_t* foreign) {
    auto e = engine(checkpointed(), id);
    if (!e) return {};
    auto s = e->submit(r);
    EXPECT_TRUE(s.ok());
    if (!s.ok()) return {};
    Outcome out;
    size_t first = 0;
    for (;;) {
      auto ev = (*s)->next(std::chrono::seconds(300));
      if (!ev) {
        ADD_FAILURE() << "timed out";
        break;
      }
      if (first == 0) first = ev->tokens.size();
      out.tokens.insert(out.tokens.end(), ev->tokens.begin(), ev->tokens.end());
      if (ev->final) {
        out.final = *ev;
        break;
      }
    }
    *foreign = e->stats().checkpoints_foreign;
    return {out, first};
  }
};

TEST_F(EngineWeightSwapCheckpointTest, ACheckpointOfOtherWeightsRunsColdWithTheNewTokens) {
  const auto r = greedy_request("ckpt", random_ids(5, 40, kVocab), 1500);
  write_weights(1);
  const std::string id_a = identity();
  const Outcome full_a = cold(r);

  // Under the same weights the checkpoint resumes (what the swap below must not do).
  crash(r, id_a);
  int64_t foreign = -1;
  auto [resumed, first] = resume(r, id_a, &foreign);
  EXPECT_GE(first, 16u);
  EXPECT_EQ(resumed.tokens, full_a.tokens);
  EXPECT_EQ(foreign, 0);

  crash(r, id_a);
  write_weights(2);
  const Outcome full_b = cold(r);
  ASSERT_NE(full_b.tokens, full_a.tokens);
  auto [swapped, first_b] = resume(r, identity(), &foreign);
  EXPECT_EQ(first_b, 1u);  // not resumed
  EXPECT_EQ(swapped.tokens, full_b.tokens);
  EXPECT_EQ(swapped.final.finish_reason, FinishReason::kLength);
  EXPECT_EQ(swapped.final.usage.cached_tokens, 0);
  EXPECT_EQ(foreign, 1);
  // Completion removed the foreign checkpoint with its own.
  for (const auto& f : fs::directory_iterator(kv_ / "checkpoints")) EXPECT_NE(f.path().extension(), ".ckpt") << f.path();
}

}  // namespace
}  // namespace strata
