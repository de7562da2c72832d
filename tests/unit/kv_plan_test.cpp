// plan_kv_pools: the one rule every executor sizes its KV pools by (kv/kv_plan.h).
#include "kv/kv_plan.h"

#include <gtest/gtest.h>

namespace strata {
namespace {

KvLimits options(int64_t bytes) {
  KvLimits o;
  o.kv_cache_bytes = bytes;
  o.block_size = 16;
  o.max_num_seqs = 4;
  o.max_batch_tokens = 256;
  return o;
}

TEST(KvPlan, FullAttentionTakesEveryByte) {
  KvPoolShape shape;
  shape.full_bytes_per_token = 1024;  // 16 KiB blocks
  auto p = plan_kv_pools(shape, options(int64_t(64) << 20), 4096);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_EQ(p->n_blocks, 4096);
  EXPECT_EQ(p->n_window_blocks, 0);
  EXPECT_EQ(p->n_quant_blocks, 0);
  EXPECT_EQ(p->n_state_slots, 0);
  EXPECT_EQ(p->kv_bytes(shape, 16), int64_t(64) << 20);
  // An explicit count wins over the bytes.
  KvLimits o = options(int64_t(64) << 20);
  o.kv_blocks = 77;
  p = plan_kv_pools(shape, o, 4096);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->n_blocks, 77);
  // Too few bytes for two blocks: the error names the option and value.
  p = plan_kv_pools(shape, options(16384), 4096);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("kv_cache_bytes 16384"), std::string::npos) << p.error().message;
}

TEST(KvPlan, WindowPoolHoldsEachSequencesWindowAtMostAnEqualShare) {
  KvPoolShape shape;
  shape.full_bytes_per_token = 512;
  shape.window_bytes_per_token = 1536;
  shape.window = 512;  // 32 blocks behind a query, +2
  // Plenty of bytes: the window pool is what 4 windows and one step need, the rest is full.
  const int64_t bytes = int64_t(256) << 20;
  auto p = plan_kv_pools(shape, options(bytes), 4096);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  const int64_t window_min = (512 - 1 + 15) / 16 + 2;
  EXPECT_EQ(p->n_window_blocks, 4 * window_min + 256 / 16);
  EXPECT_EQ(p->n_blocks, (bytes / 16 - 1536 * p->n_window_blocks) / 512);
  EXPECT_LE(p->kv_bytes(shape, 16), bytes);
  // Few bytes: both pools get an equal share of blocks, and the error names what is missing.
  p = plan_kv_pools(shape, options(int64_t(2) << 20), 4096);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->n_window_blocks, (int64_t(2) << 20) / 16 / 2048);
  EXPECT_EQ(p->n_window_blocks, p->n_blocks);
  p = plan_kv_pools(shape, options(int64_t(1) << 20), 4096);  // 32 blocks each: under one window
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("at least 2 and " + std::to_string(window_min)), std::string::npos) << p.error().message;
  // Explicit window blocks below one window are refused, naming the option.
  KvLimits o = options(bytes);
  o.kv_window_blocks = 10;
  p = plan_kv_pools(shape, o, 4096);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("kv_window_blocks 10"), std::string::npos) << p.error().message;
  // Sliding layers only: every byte goes to windows; the full pool is bookkeeping.
  KvPoolShape sliding;
  sliding.window_bytes_per_token = 1024;
  sliding.window = 512;
  p = plan_kv_pools(sliding, options(int64_t(64) << 20), 4096);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->n_window_blocks, 4096);
  EXPECT_EQ(p->n_blocks, 4 * (4096 / 16));
}

TEST(KvPlan, DelayedQuantizationSplitsExactAndCodecPools) {
  // Exact 1024 B/token, codec 272: 16-token blocks of 16 KiB and 4352 B.
  KvPoolShape shape;
  shape.full_bytes_per_token = 1024;
  shape.quant_bytes_per_token = 272;
  const int64_t budget = int64_t(64) << 20;
  KvLimits o = options(budget);
  int32_t q = 512;
  auto p = plan_kv_pools(shape, o, 4096, q);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  // 4 sequences x (32 + 1) blocks + 16 for one step's tokens.
  EXPECT_EQ(p->n_blocks, 4 * 33 + 16);
  EXPECT_EQ(p->n_quant_blocks, (budget - int64_t(p->n_blocks) * 16384) / 4352);
  // Many sequences: the exact pool stops at half the bytes.
  o.max_num_seqs = 256;
  p = plan_kv_pools(shape, o, 4096, q);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->n_blocks, budget / 2 / 16384);
  EXPECT_EQ(p->n_quant_blocks, budget / 2 / 4352);
  // Explicit block counts.
  o.max_num_seqs = 4;
  o.kv_blocks = 40;
  p = plan_kv_pools(shape, o, 4096, q);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->n_blocks, 40);
  EXPECT_EQ(p->n_quant_blocks, 40);
  o.kv_quant_blocks = 100;
  p = plan_kv_pools(shape, o, 4096, q);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->n_quant_blocks, 100);
  // Too small: the errors name the option and value.
  o.kv_quant_blocks = 0;
  o.kv_blocks = 20;
  p = plan_kv_pools(shape, o, 4096, q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("kv_blocks 20"), std::string::npos) << p.error().message;
  o.kv_blocks = 0;
  o.kv_cache_bytes = int64_t(1) << 19;  // under 34 exact blocks
  p = plan_kv_pools(shape, o, 4096, q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("kv_cache_bytes 524288"), std::string::npos) << p.error().message;
  o.kv_cache_bytes = budget;
  q = -3;
  p = plan_kv_pools(shape, o, 4096, q);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("--kv-quant-start must be >= 0, got -3"), std::string::npos) << p.error().message;
}

TEST(KvPlan, DelayedQuantizationKeepsTheWindowPoolOfExactKv) {
  // Full layers 1024 B/token exact, 272 in the codec; window layers 2048 B/token, window 100.
  KvPoolShape shape;
  shape.full_bytes_per_token = 1024;
  shape.quant_bytes_per_token = 272;
  shape.window_bytes_per_token = 2048;
  shape.window = 100;
  const int64_t budget = int64_t(64) << 20;
  KvLimits o = options(budget);
  auto plain = plan_kv_pools(shape, o, 4096);
  ASSERT_TRUE(plain.ok()) << plain.error().to_string();
  auto p = plan_kv_pools(shape, o, 4096, 512);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  // The window pool as without conversion: 4 x (ceil(99 / 16) + 2) + 16 blocks.
  EXPECT_EQ(p->n_window_blocks, 4 * 9 + 16);
  EXPECT_EQ(p->n_window_blocks, plain->n_window_blocks);
  EXPECT_EQ(p->n_blocks, 4 * 33 + 16);
  const int64_t left = budget - int64_t(p->n_window_blocks) * 2048 * 16 - int64_t(p->n_blocks) * 16384;
  EXPECT_EQ(p->n_quant_blocks, left / 4352);
  EXPECT_LE(p->kv_bytes(shape, 16), budget);
  // Explicit counts.
  o.kv_blocks = 40;
  o.kv_window_blocks = 30;
  p = plan_kv_pools(shape, o, 4096, 512);
  ASSERT_TRUE(p.ok()) << p.error().to_string();
  EXPECT_EQ(p->n_blocks, 40);
  EXPECT_EQ(p->n_window_blocks, 30);
  EXPECT_EQ(p->n_quant_blocks, 40);
  o.kv_window_blocks = 5;  // under one window of 100 tokens
  p = plan_kv_pools(shape, o, 4096, 512);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("kv_window_blocks 5"), std::string::npos) << p.error().message;
  // Bytes for the windows but not for the exact pool after them: named with both.
  o = options(int64_t(52) * 2048 * 16 + 34 * 16384 + 100);  // the windows, 34 exact blocks, no 2 codec blocks
  o.kv_window_blocks = 52;
  p = plan_kv_pools(shape, o, 4096, 512);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message.find("sliding-window blocks"), std::string::npos) << p.error().message;
}

TEST(KvPlan, RecurrentStateGetsASlotPerSequence) {
  KvPoolShape shape;
  shape.full_bytes_per_token = 256;
  shape.has_state = true;
  auto p = plan_kv_pools(shape, options(int64_t(8) << 20), 4096);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->n_state_slots, 4);
  EXPECT_NE(p->describe(shape, 16).find("4 recurrent-state slots"), std::string::npos) << p->describe(shape, 16);
}

TEST(KvPlan, RefusesBadLimitsNamingThem) {
  KvPoolShape shape;
  shape.full_bytes_per_token = 256;
  KvLimits o = options(int64_t(8) << 20);
  o.block_size = 0;
  EXPECT_NE(plan_kv_pools(shape, o, 4096).error().message.find("block_size must be in [1, 1024], got 0"), std::string::npos);
  o = options(int64_t(8) << 20);
  o.max_num_seqs = 0;
  EXPECT_NE(plan_kv_pools(shape, o, 4096).error().message.find("max_num_seqs must be >= 1, got 0"), std::string::npos);
  o = options(int64_t(8) << 20);
  o.max_batch_tokens = -1;
  EXPECT_NE(plan_kv_pools(shape, o, 4096).error().message.find("max_batch_tokens must be >= 1, got -1"), std::string::npos);
}

TEST(KvPlan, DeviceBytesAreTheFractionLessWhatIsTaken) {
  const int64_t gib = int64_t(1) << 30;
  auto b = device_kv_bytes(0.9, 100 * gib, 99 * gib, 16 * gib, gib);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(*b, int64_t(0.9 * double(100 * gib)) - gib - 16 * gib - gib);
  b = device_kv_bytes(0.1, 100 * gib, 99 * gib, 16 * gib, gib);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("--gpu-memory-fraction 0.1"), std::string::npos) << b.error().message;
  b = device_kv_bytes(1.5, 100 * gib, 99 * gib, 16 * gib, gib);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.error().message.find("(0, 1]"), std::string::npos) << b.error().message;
}

}  // namespace
}  // namespace strata
