// sample() and logprobs() allocate nothing once warmed up at a vocabulary size. This binary
// replaces the global operator new to count allocations, so it stays a file of its own.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "sampling/sampler.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}

void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace strata {
namespace {

TEST(SamplerAllocation, NoAllocationPerCallAfterWarmUp) {
  const int32_t n = 150000;
  Xoshiro256 rng(4);
  std::vector<std::vector<float>> rows(8, std::vector<float>(n));
  for (auto& row : rows) {
    for (auto& v : row) v = static_cast<float>(rng.next_double() * 16.0 - 8.0);
  }
  std::vector<SamplingParams> variants(6);
  variants[0].temperature = 0.0f;
  variants[2].top_k = 40;
  variants[3].top_p = 0.9f;
  variants[4].min_p = 0.05f;
  variants[5].top_k = 2000;
  variants[5].top_p = 0.95f;
  for (auto& p : variants) {
    p.repetition_penalty = 1.2f;
    p.presence_penalty = 0.5f;
    p.logit_bias = {{1, 2.0f}};
    auto created = Sampler::create(p, n, std::vector<int32_t>{1, 2, 3});
    ASSERT_TRUE(created.ok());
    Sampler s = std::move(created).value();
    s.accept(5);
    TokenLogprobs lp;
    // Warm-up: every row once, so the candidate lists reach their largest size.
    for (auto& row : rows) {
      const int32_t t = s.sample(row.data(), n);
      ASSERT_TRUE(s.logprobs(row.data(), n, t, kMaxTopLogprobs, &lp).ok());
    }
    const int64_t before = g_allocations.load();
    for (int rep = 0; rep < 3; ++rep) {
      for (auto& row : rows) {
        const int32_t t = s.sample(row.data(), n);
        ASSERT_TRUE(s.logprobs(row.data(), n, t, kMaxTopLogprobs, &lp).ok());
      }
    }
    EXPECT_EQ(g_allocations.load() - before, 0) << "top_k " << p.top_k << " top_p " << p.top_p;
  }
}

}  // namespace
}  // namespace strata
