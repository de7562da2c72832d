#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/thread_pool.h"

namespace strata {

TEST(ThreadPool, CoversEveryIndexOnceWithStaticRanges) {
  ThreadPool pool(3);
  for (int64_t n : {1, 2, 3, 7, 64, 1000}) {
    std::vector<std::atomic<int>> hits(n);
    pool.parallel_for(n, [&](int64_t b, int64_t e, int) {
      for (int64_t i = b; i < e; ++i) hits[i]++;
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, SameIndexSameThreadEveryTime) {
  ThreadPool pool(2);
  std::vector<int> first(100), second(100);
  pool.parallel_for(100, [&](int64_t b, int64_t e, int t) { for (int64_t i = b; i < e; ++i) first[i] = t; });
  pool.parallel_for(100, [&](int64_t b, int64_t e, int t) { for (int64_t i = b; i < e; ++i) second[i] = t; });
  EXPECT_EQ(first, second);
}

TEST(ThreadPool, GrainAlignsRanges) {
  ThreadPool pool(2);
  std::vector<std::pair<int64_t, int64_t>> ranges(2, {-1, -1});
  pool.parallel_for(100, [&](int64_t b, int64_t e, int t) { ranges[t] = {b, e}; }, 16);
  for (auto [b, e] : ranges) {
    if (b < 0) continue;
    EXPECT_EQ(b % 16, 0);
  }
}

}  // namespace strata
