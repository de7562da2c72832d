// Recurrent-state slots and the snapshot store: slots are handed out once and come back;
// snapshots stay within their byte budget, least recently used dropped first, equal hashes
// refreshed rather than rewritten.
#include <gtest/gtest.h>

#include "core/check.h"
#include "kv/state_cache.h"

namespace strata {
namespace {

TEST(KvStateSlots, HandsOutEachSlotOnce) {
  StateSlotPool p(3);
  const int32_t a = p.allocate(), b = p.allocate(), c = p.allocate();
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 2);
  EXPECT_EQ(p.allocate(), -1);
  p.release(b);
  EXPECT_EQ(p.n_free(), 1);
  EXPECT_EQ(p.allocate(), 1);
  EXPECT_THROW(p.release(7), InvariantError);
  p.release(a);
  EXPECT_THROW(p.release(a), InvariantError);
}

TEST(KvStateSnapshots, ByteBudgetAndLru) {
  StateSnapshotStore s(3 * 10 * sizeof(float));
  for (uint64_t h = 1; h <= 3; ++h) {
    float* d = s.insert(h, int32_t(h) * 16, 10);
    ASSERT_NE(d, nullptr);
    for (int i = 0; i < 10; ++i) d[i] = float(h * 100 + uint64_t(i));
  }
  EXPECT_EQ(s.stats().bytes, int64_t(30 * sizeof(float)));
  // Equal hash: nothing to write, refreshed (now most recent).
  EXPECT_EQ(s.insert(1, 16, 10), nullptr);
  ASSERT_NE(s.insert(4, 64, 10), nullptr);  // drops 2, the least recently used
  EXPECT_TRUE(s.contains(1));
  EXPECT_FALSE(s.contains(2));
  EXPECT_TRUE(s.contains(3));
  const StateSnapshot* one = s.find(1);
  ASSERT_NE(one, nullptr);
  EXPECT_EQ(one->position, 16);
  EXPECT_EQ(one->data[9], 109.0f);
  ASSERT_NE(s.insert(5, 80, 10), nullptr);  // 3 is now the oldest (1 was found)
  EXPECT_FALSE(s.contains(3));
  EXPECT_TRUE(s.contains(1));
  EXPECT_EQ(s.stats().evictions, 2);
  EXPECT_EQ(s.stats().count, 3);
  // Larger than the whole budget: not stored, nothing dropped.
  EXPECT_EQ(s.insert(6, 96, 31), nullptr);
  EXPECT_EQ(s.stats().count, 3);
  // A hash reused for another position is a broken invariant.
  EXPECT_THROW(s.insert(1, 32, 10), InvariantError);
}

}  // namespace
}  // namespace strata
