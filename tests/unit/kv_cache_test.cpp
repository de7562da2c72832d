// Block pool, prefix index, LRU, session pins, eviction order and reference counts.
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "core/check.h"

#include "kv/block_pool.h"
#include "kv/eviction_policy.h"
#include "kv/kv_cache_manager.h"
#include "kv/prefix_index.h"

namespace strata {
namespace {

constexpr int32_t kBs = 4;

std::vector<int32_t> iota_tokens(int32_t n, int32_t start = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

// Allocates and publishes blocks for `tokens` (full blocks only), as a sequence would.
std::vector<int32_t> fill(KvCacheManager& kv, uint64_t salt, const std::vector<int32_t>& tokens, double now) {
  std::vector<uint64_t> hashes;
  extend_block_hashes(hashes, salt, tokens, kBs);
  std::vector<int32_t> blocks;
  for (size_t i = 0; i < hashes.size(); ++i) {
    const int32_t b = kv.allocate(now);
    EXPECT_GE(b, 0);
    blocks.push_back(b);
    kv.publish(b, hashes[i]);
  }
  return blocks;
}

TEST(KvBlockPool, FreeListRefcountsAndIdleQueues) {
  BlockPool pool(4, kBs, 2);
  EXPECT_EQ(pool.n_free(), 4);
  const int32_t a = pool.pop_free(), b = pool.pop_free();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  pool.add_ref(a);
  pool.add_ref(a);
  pool.add_ref(b);
  EXPECT_EQ(pool.n_in_use(), 2);
  EXPECT_EQ(pool.drop_ref(a), 1);
  EXPECT_EQ(pool.drop_ref(a), 0);
  EXPECT_THROW(pool.drop_ref(a), InvariantError);
  pool.set_hash(a, 7);
  pool.push_idle(a, 1, 5.0);
  EXPECT_THROW(pool.add_ref(a), InvariantError);  // must leave the queue first
  EXPECT_EQ(pool.idle_front(1), a);
  EXPECT_EQ(pool.n_idle(), 1);
  EXPECT_THROW(pool.push_free(a), InvariantError);  // published and idle
  pool.remove_idle(a);
  pool.clear_hash(a);
  pool.push_free(a);
  EXPECT_EQ(pool.n_free(), 3);
}

TEST(KvPrefixIndex, ChainedHashesDependOnSaltAndHistory) {
  const uint64_t s1 = prefix_namespace_salt("model=a;codec=f32");
  const uint64_t s2 = prefix_namespace_salt("model=b;codec=f32");
  std::vector<uint64_t> h1, h2, h3;
  auto t = iota_tokens(10);
  extend_block_hashes(h1, s1, t, kBs);
  extend_block_hashes(h2, s2, t, kBs);
  ASSERT_EQ(h1.size(), 2u);  // 10 tokens: two full blocks
  EXPECT_NE(h1[0], h2[0]);
  // Same second block after a different first block: different hash.
  auto u = t;
  u[0] = 9999;
  extend_block_hashes(h3, s1, u, kBs);
  EXPECT_NE(h1[0], h3[0]);
  EXPECT_NE(h1[1], h3[1]);
  // Extending continues where it stopped.
  t.resize(12, 5);
  extend_block_hashes(h1, s1, t, kBs);
  ASSERT_EQ(h1.size(), 3u);
  std::vector<uint64_t> fresh;
  extend_block_hashes(fresh, s1, t, kBs);
  EXPECT_EQ(fresh, h1);
}

TEST(KvCacheManager, LongestChainIsSharedWithReferences) {
  KvCacheManager kv(16, kBs);
  const uint64_t salt = prefix_namespace_salt("m");
  auto tokens = iota_tokens(12);
  auto blocks = fill(kv, salt, tokens, 0.0);
  ASSERT_EQ(blocks.size(), 3u);

  auto other = tokens;
  other[9] = 1;  // third block differs
  std::vector<uint64_t> hashes;
  extend_block_hashes(hashes, salt, other, kBs);
  EXPECT_EQ(kv.count_cached(hashes), 2);
  auto shared = kv.acquire_cached(hashes);
  ASSERT_EQ(shared.size(), 2u);
  EXPECT_EQ(shared[0], blocks[0]);
  EXPECT_EQ(shared[1], blocks[1]);
  EXPECT_EQ(kv.pool().meta(blocks[0]).ref_count, 2);
  EXPECT_EQ(kv.pool().meta(blocks[2]).ref_count, 1);

  kv.release(blocks, 1.0);
  auto st = kv.stats(1.0);
  EXPECT_EQ(st.used, 2);
  EXPECT_EQ(st.cached, 1);  // block 2 idle but still published
  kv.release(shared, 2.0);
  st = kv.stats(2.0);
  EXPECT_EQ(st.used, 0);
  EXPECT_EQ(st.cached, 3);
  EXPECT_EQ(st.free, 13);
  // Still findable after every reference dropped.
  std::vector<uint64_t> all;
  extend_block_hashes(all, salt, tokens, kBs);
  EXPECT_EQ(kv.count_cached(all), 3);
  auto again = kv.acquire_cached(all);
  EXPECT_EQ(again, blocks);
  EXPECT_EQ(kv.stats(3.0).cached, 0);
}

TEST(KvCacheManager, UnpublishedBlocksReturnToFreeListAndDuplicatesStayPrivate) {
  KvCacheManager kv(4, kBs);
  const uint64_t salt = prefix_namespace_salt("m");
  auto tokens = iota_tokens(4);
  auto a = fill(kv, salt, tokens, 0.0);
  // A second sequence computed the same block concurrently: its copy stays unpublished.
  const int32_t dup = kv.allocate(0.0);
  std::vector<uint64_t> h;
  extend_block_hashes(h, salt, tokens, kBs);
  EXPECT_FALSE(kv.publish(dup, h[0]));
  EXPECT_FALSE(kv.publish(a[0], h[0]));  // already published
  const std::vector<int32_t> d{dup};
  kv.release(d, 1.0);
  EXPECT_EQ(kv.stats(1.0).free, 3);
  EXPECT_EQ(kv.index().find(h[0]), a[0]);
}

TEST(KvCacheManager, EvictsLeastRecentlyUsedChainTailsFirst) {
  KvCacheManager kv(6, kBs);
  const uint64_t salt = prefix_namespace_salt("m");
  auto ta = iota_tokens(8, 0), tb = iota_tokens(8, 1000);
  auto a = fill(kv, salt, ta, 0.0);
  auto b = fill(kv, salt, tb, 0.0);
  kv.release(a, 1.0);  // a idle first: older
  kv.release(b, 2.0);
  // Two blocks free; the next allocations evict a's tail, then a's head, then b's tail.
  EXPECT_GE(kv.allocate(3.0), 0);
  EXPECT_GE(kv.allocate(3.0), 0);
  EXPECT_EQ(kv.allocate(3.0), a[1]);
  EXPECT_EQ(kv.allocate(3.0), a[0]);
  EXPECT_EQ(kv.allocate(3.0), b[1]);
  EXPECT_EQ(kv.stats(3.0).evictions, 3);
  std::vector<uint64_t> hb;
  extend_block_hashes(hb, salt, tb, kBs);
  EXPECT_EQ(kv.count_cached(hb), 1);
  EXPECT_EQ(kv.allocate(3.0), b[0]);
  EXPECT_EQ(kv.allocate(3.0), -1);  // every block referenced
}

TEST(KvCacheManager, RecentUseMovesABlockBackInTheQueue) {
  KvCacheManager kv(4, kBs);
  const uint64_t salt = prefix_namespace_salt("m");
  auto ta = iota_tokens(4, 0), tb = iota_tokens(4, 50);
  auto a = fill(kv, salt, ta, 0.0);
  auto b = fill(kv, salt, tb, 0.0);
  kv.release(a, 1.0);
  kv.release(b, 2.0);
  std::vector<uint64_t> ha;
  extend_block_hashes(ha, salt, ta, kBs);
  auto a2 = kv.acquire_cached(ha);  // a used again
  kv.release(a2, 3.0);
  kv.allocate(4.0);
  kv.allocate(4.0);
  EXPECT_EQ(kv.allocate(4.0), b[0]);
  EXPECT_EQ(kv.allocate(4.0), a[0]);
}

TEST(KvCacheManager, SessionPinsAreEvictedLastButNeverRefused) {
  KvCacheManager kv(3, kBs);
  const uint64_t salt = prefix_namespace_salt("m");
  auto ts = iota_tokens(4, 0), to = iota_tokens(4, 50);
  auto s = fill(kv, salt, ts, 0.0);
  auto o = fill(kv, salt, to, 0.0);
  kv.release(s, 1.0, /*pin_until=*/601.0);  // session block, older
  kv.release(o, 2.0);                        // ordinary block, newer
  EXPECT_EQ(kv.stats(10.0).pinned, 1);
  EXPECT_EQ(kv.allocate(10.0), 2);     // the free one
  EXPECT_EQ(kv.allocate(10.0), o[0]);  // ordinary before the pinned one despite being newer
  EXPECT_EQ(kv.allocate(10.0), s[0]);  // pinned: evicted last, but evicted
  EXPECT_EQ(kv.allocate(10.0), -1);
}

TEST(KvCacheManager, ExpiredPinsCompeteByIdleTime) {
  KvCacheManager kv(2, kBs);
  const uint64_t salt = prefix_namespace_salt("m");
  auto ts = iota_tokens(4, 0), to = iota_tokens(4, 50);
  auto s = fill(kv, salt, ts, 0.0);
  auto o = fill(kv, salt, to, 0.0);
  kv.release(s, 1.0, /*pin_until=*/100.0);
  kv.release(o, 2.0);
  EXPECT_EQ(kv.stats(50.0).pinned, 1);
  EXPECT_EQ(kv.stats(200.0).pinned, 0);
  EXPECT_EQ(kv.allocate(200.0), s[0]);  // pin expired and idle longest
  EXPECT_EQ(kv.allocate(200.0), o[0]);
}

TEST(KvEvictionPolicy, LivePinsGoInTheirOwnQueue) {
  SessionLruPolicy p;
  BlockMeta m;
  m.pin_until = 10.0;
  EXPECT_EQ(p.queue_for(m, 5.0), SessionLruPolicy::kPinned);
  EXPECT_EQ(p.queue_for(m, 10.0), SessionLruPolicy::kOrdinary);
  m.pin_until = 0.0;
  EXPECT_EQ(p.queue_for(m, 0.0), SessionLruPolicy::kOrdinary);
}

}  // namespace
}  // namespace strata
