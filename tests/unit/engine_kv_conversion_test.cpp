// Delayed KV quantization bookkeeping (engine/kv_conversion.h) with the scheduler and no model:
// the budget split between the exact and the codec pool, conversion once a sequence passes
// quant_start (its converted blocks hold the encoded exact rows, its exact pool keeps only the
// block it writes into), prefix hits on converted blocks under the codec namespace only for
// sequences that pass quant_start, exact hits never handed converted blocks, published blocks
// never rewritten, and release of both pools on finish and preemption.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "backend/reference/kv_codec.h"
#include "engine/kv_conversion.h"
#include "engine/scheduler.h"
#include "kv/prefix_index.h"

namespace strata {
namespace {

constexpr int32_t kBs = 4;      // tokens per block
constexpr int32_t kStart = 10;  // quant_start
constexpr int32_t kDim = 16;
constexpr int32_t kKvHeads = 2;

std::vector<KvLayerSpec> layout(KvCodec c) {
  KvLayerSpec s;
  s.n_kv_heads = kKvHeads;
  s.head_dim_k = kDim;
  s.head_dim_v = kDim;
  s.codec = {c, kv_default_group(c, kDim)};
  return {s, s};
}

struct Rig {
  Rig(int32_t n_exact, int32_t n_quant)
      : exact_pool(n_exact, kBs),
        sched(options(), exact_pool, std::make_unique<FcfsPolicy>()),
        storage(layout(KvCodec::kAuto), n_exact, kBs),
        conv(kStart, n_quant, prefix_namespace_salt("codec"), exact_pool, storage, layout(KvCodec::kInt8)) {
    sched.set_kv_conversion(&conv);
    // Every exact row distinct, so a converted block shows which exact block it came from.
    std::mt19937 rng(7);
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (int l = 0; l < 2; ++l) {
      const size_t n = size_t(n_exact) * kBs * kKvHeads * kDim;
      for (size_t i = 0; i < n; ++i) storage.k_pool(l)[i] = d(rng), storage.v_pool(l)[i] = d(rng);
    }
  }
  static SchedulerOptions options() {
    SchedulerOptions o;
    o.max_batch_tokens = 64;
    o.max_num_seqs = 4;
    o.prefix_salt = prefix_namespace_salt("exact");
    return o;
  }
  // One step: plan, "run" (rows are already in the storage), commit, then convert as the
  // engine does before its next plan.
  StepPlan step() {
    StepPlan plan = sched.schedule(now);
    for (const auto& span : plan.spans) {
      sched.commit(span);
      if (span.sample) span.seq->tokens.push_back(int32_t(span.seq->n_tokens() % 50));  // the "sampled" token
    }
    for (Sequence* s : sched.running()) conv.convert(s, now, true);
    conv.flush();
    now += 1.0;
    return plan;
  }
  // Steps until seq holds at least n computed tokens.
  void run_to(Sequence* seq, int32_t n) {
    for (int i = 0; i < 200 && seq->n_computed < n; ++i) step();
    ASSERT_GE(seq->n_computed, n);
  }

  KvCacheManager exact_pool;
  Scheduler sched;
  KvStorage storage;
  KvConversion conv;
  double now = 0.0;
};

Sequence make_seq(uint64_t id, int32_t n_prompt, int32_t salt = 0) {
  Sequence s;
  s.id = id;
  s.arrival = id;
  for (int32_t i = 0; i < n_prompt; ++i) s.tokens.push_back(100 + (i * 7 + salt) % 31);
  s.n_prompt = n_prompt;
  return s;
}

TEST(KvConversion, FullBlocksMoveOncePastTheStartAndHoldTheEncodedRows) {
  Rig rig(32, 32);
  Sequence a = make_seq(1, 9);  // within quant_start: stays exact
  rig.sched.add(&a);
  rig.step();
  EXPECT_EQ(a.n_computed, 9);
  EXPECT_EQ(a.n_quant_blocks, 0);
  rig.run_to(&a, kStart);
  EXPECT_EQ(a.n_quant_blocks, 0);  // at quant_start, not past it
  EXPECT_EQ(rig.conv.pool().stats(0).used, 0);
  // Keep the exact ids and rows of its two full blocks before they move.
  const std::vector<int32_t> exact_ids(a.blocks.begin(), a.blocks.begin() + 2);
  rig.run_to(&a, kStart + 1);
  ASSERT_EQ(a.n_quant_blocks, 2);  // 11 tokens: two full blocks
  for (int32_t i = 0; i < 2; ++i) {
    const int32_t q = a.blocks[size_t(i)];
    for (int l = 0; l < 2; ++l) {
      for (int32_t r = 0; r < kBs * kKvHeads; ++r) {
        const int64_t src_row = int64_t(exact_ids[size_t(i)]) * kBs * kKvHeads + r;
        const int64_t dst_row = int64_t(q) * kBs * kKvHeads + r;
        const KvRowFormat kf = rig.conv.storage().k_format(l), vf = rig.conv.storage().v_format(l);
        std::vector<uint8_t> want(size_t(kf.bytes()));
        reference::kv_encode_row(kf, rig.storage.k_pool(l) + src_row * kDim, want.data(), 0);
        EXPECT_EQ(std::memcmp(want.data(), rig.conv.storage().k_rows(l) + dst_row * kf.bytes(), want.size()), 0);
        reference::kv_encode_row(vf, rig.storage.v_pool(l) + src_row * kDim, want.data(), 0);
        EXPECT_EQ(std::memcmp(want.data(), rig.conv.storage().v_rows(l) + dst_row * vf.bytes(), want.size()), 0);
      }
    }
  }
  // Decoding on: after every step the exact pool holds only the block being written.
  for (int i = 0; i < 20; ++i) {
    rig.step();
    EXPECT_EQ(a.n_quant_blocks, a.n_computed / kBs);
    EXPECT_LE(int32_t(a.blocks.size()) - a.n_quant_blocks, 1);
    EXPECT_EQ(rig.exact_pool.stats(0).used, int32_t(a.blocks.size()) - a.n_quant_blocks);
    EXPECT_EQ(rig.conv.pool().stats(0).used, a.n_quant_blocks);
  }
  EXPECT_EQ(rig.conv.converted_blocks(), a.n_quant_blocks);
  // Published: each converted block under the codec hash of its exact-namespace hash.
  for (int32_t i = 0; i < a.n_quant_blocks; ++i) {
    EXPECT_EQ(rig.conv.pool().index().find(rig.conv.codec_hash(a.block_hashes[size_t(i)])), a.blocks[size_t(i)]);
    EXPECT_NE(rig.conv.codec_hash(a.block_hashes[size_t(i)]), a.block_hashes[size_t(i)]);
  }
  // Exact namespace: only the blocks computed before anything was converted (the first two).
  EXPECT_EQ(rig.exact_pool.index().size(), 2u);
  EXPECT_EQ(rig.exact_pool.index().find(a.block_hashes[0]), exact_ids[0]);
  EXPECT_EQ(rig.exact_pool.index().find(a.block_hashes[1]), exact_ids[1]);
  // Finish frees both pools (published blocks stay cached).
  rig.sched.finish(&a, rig.now);
  EXPECT_EQ(rig.exact_pool.stats(0).used, 0);
  EXPECT_EQ(rig.conv.pool().stats(0).used, 0);
  EXPECT_EQ(rig.conv.pool().stats(0).cached, rig.conv.converted_blocks());
  EXPECT_TRUE(a.blocks.empty());
  EXPECT_EQ(a.n_quant_blocks, 0);
}

TEST(KvConversion, PrefixHitsFollowTheNamespaces) {
  Rig rig(12, 32);
  Sequence a = make_seq(1, 30);  // prefilled in one step, then converted
  rig.sched.add(&a);
  rig.step();
  rig.step();
  ASSERT_EQ(a.n_quant_blocks, 7);
  rig.sched.finish(&a, rig.now);

  // The same prompt again: its tokens pass quant_start, so it starts from the converted blocks.
  Sequence b = make_seq(2, 30);
  rig.sched.add(&b);
  rig.step();
  EXPECT_EQ(b.cached_tokens, 7 * kBs);
  EXPECT_EQ(rig.conv.shared_blocks(), 0);
  // Its hit is the 7 converted blocks of a (exact ones were there too: the codec chain wins a tie).
  EXPECT_GE(b.n_quant_blocks, 7);
  for (int32_t i = 0; i < 7; ++i) {
    EXPECT_EQ(b.blocks[size_t(i)], rig.conv.pool().index().find(rig.conv.codec_hash(b.block_hashes[size_t(i)])));
  }
  rig.sched.finish(&b, rig.now);

  // A prompt within quant_start sharing the prefix: exact blocks only.
  Sequence c = make_seq(3, 9);
  rig.sched.add(&c);
  rig.step();
  EXPECT_EQ(c.cached_tokens, 2 * kBs);
  EXPECT_EQ(c.n_quant_blocks, 0);
  EXPECT_EQ(c.blocks[0], rig.exact_pool.index().find(c.block_hashes[0]));
  rig.sched.finish(&c, rig.now);

  // Another sequence fills the exact pool and evicts the exact prefix; the codec blocks stay
  // but a prompt within quant_start must not be handed them.
  Sequence e = make_seq(4, 48, 5);
  rig.sched.add(&e);
  for (int i = 0; i < 3; ++i) rig.step();
  rig.sched.finish(&e, rig.now);
  Sequence f = make_seq(5, 12);  // blocks 0..1 are a's, 2 is not full of a's tokens
  rig.sched.add(&f);
  Sequence g = make_seq(6, 9);
  ASSERT_EQ(rig.exact_pool.index().find(a.block_hashes[0]), -1) << "the exact prefix was evicted";
  ASSERT_GE(rig.conv.pool().index().find(rig.conv.codec_hash(a.block_hashes[0])), 0);
  rig.sched.add(&g);
  rig.step();
  EXPECT_EQ(f.cached_tokens, 2 * kBs);  // 12 tokens pass quant_start: converted hits
  ASSERT_GE(f.n_quant_blocks, 2);
  EXPECT_EQ(f.blocks[0], rig.conv.pool().index().find(rig.conv.codec_hash(a.block_hashes[0])));
  EXPECT_EQ(g.cached_tokens, 0);        // 9 tokens: exact only, and there are none
  EXPECT_EQ(g.n_quant_blocks, 0);
}

TEST(KvConversion, PublishedBlocksAreNeverRewrittenAndSharedConversions) {
  Rig rig(32, 32);
  // Two sequences with the same prompt within quant_start share exact blocks; when both pass
  // it, the second one's conversion takes the first one's codec blocks, and the shared exact
  // blocks keep their bytes.
  Sequence a = make_seq(1, 8), b = make_seq(2, 8);
  rig.sched.add(&a);
  rig.step();
  rig.sched.add(&b);
  std::vector<float> before(rig.storage.k_pool(0), rig.storage.k_pool(0) + 32 * kBs * kKvHeads * kDim);
  rig.run_to(&a, kStart + 1);
  ASSERT_GT(a.n_quant_blocks, 0);
  const KvRowFormat kf = rig.conv.storage().k_format(0);
  const int64_t block_bytes = kBs * kKvHeads * kf.bytes();
  const uint8_t* a0 = rig.conv.storage().k_rows(0) + a.blocks[0] * block_bytes;
  const std::vector<uint8_t> a0_bytes(a0, a0 + block_bytes);
  rig.run_to(&b, kStart + 3);
  rig.run_to(&a, kStart + 3);
  EXPECT_EQ(std::memcmp(a0_bytes.data(), a0, size_t(block_bytes)), 0);  // a's published codec block kept its bytes
  EXPECT_EQ(b.cached_tokens, kBs);  // the first block of a (at least the last token is computed)
  ASSERT_GT(a.n_quant_blocks, 0);
  ASSERT_GT(b.n_quant_blocks, 0);
  EXPECT_EQ(a.blocks[0], b.blocks[0]);  // one converted copy of the shared block
  EXPECT_GE(rig.conv.shared_blocks(), 1);
  // Exact rows are only ever written by the steps (this rig writes none): unchanged.
  EXPECT_EQ(std::memcmp(before.data(), rig.storage.k_pool(0), before.size() * sizeof(float)), 0);
}

TEST(KvConversion, PreemptionFreesBothPools) {
  Rig rig(8, 6);  // the codec pool fills up: conversion waits, the exact pool runs out, preemption
  Sequence a = make_seq(1, 12), b = make_seq(2, 12, 3);
  rig.sched.add(&a);
  rig.sched.add(&b);
  int64_t preempted = 0;
  for (int i = 0; i < 40; ++i) {
    const StepPlan p = rig.step();
    preempted += int64_t(p.preempted.size());
    // Invariants: a sequence's codec blocks lead its table; references add up in both pools.
    int32_t exact_refs = 0, quant_refs = 0;
    for (const Sequence* s : rig.sched.running()) {
      exact_refs += int32_t(s->blocks.size()) - s->n_quant_blocks;
      quant_refs += s->n_quant_blocks;
    }
    EXPECT_LE(rig.exact_pool.stats(0).used, exact_refs);
    EXPECT_LE(rig.conv.pool().stats(0).used, quant_refs);
    for (const Sequence* s : rig.sched.waiting()) {
      EXPECT_TRUE(s->blocks.empty());
      EXPECT_EQ(s->n_quant_blocks, 0);
    }
  }
  EXPECT_GT(preempted, 0);
  rig.sched.finish(&a, rig.now);
  rig.sched.finish(&b, rig.now);
  EXPECT_EQ(rig.exact_pool.stats(0).used, 0);
  EXPECT_EQ(rig.conv.pool().stats(0).used, 0);
}

}  // namespace
}  // namespace strata
