#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "sampling/logprobs.h"
#include "sampling/sampler.h"

namespace strata {
namespace {

TEST(Logprobs, LogSoftmaxOfTheChosenTokenAndSortedTopN) {
  // Probabilities 0.1, 0.2, 0.3, 0.4 shifted by an arbitrary constant.
  std::vector<float> l;
  for (double p : {0.1, 0.2, 0.3, 0.4}) l.push_back(static_cast<float>(std::log(p) + 7.0));
  TokenLogprobs out;
  ASSERT_TRUE(compute_logprobs(l.data(), 4, 1, 3, &out).ok());
  EXPECT_EQ(out.chosen.token, 1);
  EXPECT_NEAR(out.chosen.logprob, std::log(0.2), 1e-6);
  ASSERT_EQ(out.top.size(), 3u);
  EXPECT_EQ(out.top[0].token, 3);
  EXPECT_NEAR(out.top[0].logprob, std::log(0.4), 1e-6);
  EXPECT_EQ(out.top[1].token, 2);
  EXPECT_NEAR(out.top[1].logprob, std::log(0.3), 1e-6);
  EXPECT_EQ(out.top[2].token, 1);
  ASSERT_TRUE(compute_logprobs(l.data(), 4, 0, 0, &out).ok());
  EXPECT_TRUE(out.top.empty());
  EXPECT_NEAR(out.chosen.logprob, std::log(0.1), 1e-6);
}

TEST(Logprobs, TiesAreOrderedByIdAndNanCountsAsMinusInfinity) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> l = {1.0f, 2.0f, nan, 2.0f, 1.0f, 2.0f};
  TokenLogprobs out;
  ASSERT_TRUE(compute_logprobs(l.data(), 6, 2, 5, &out).ok());
  ASSERT_EQ(out.top.size(), 5u);
  const std::vector<int32_t> order = {1, 3, 5, 0, 4};
  for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(out.top[i].token, order[i]) << i;
  EXPECT_EQ(out.chosen.logprob, -std::numeric_limits<float>::infinity());
  const double z = 3 * std::exp(2.0) + 2 * std::exp(1.0);
  EXPECT_NEAR(out.top[0].logprob, 2.0 - std::log(z), 1e-6);
}

TEST(Logprobs, TopNIsTheTrueTopOfALargeVocabulary) {
  Xoshiro256 rng(8);
  const int32_t n = 150000;
  std::vector<float> l(n);
  for (auto& v : l) v = static_cast<float>(rng.next_double() * 20.0 - 10.0);
  TokenLogprobs out;
  ASSERT_TRUE(compute_logprobs(l.data(), n, 17, kMaxTopLogprobs, &out).ok());
  std::vector<int32_t> ids(n);
  for (int32_t i = 0; i < n; ++i) ids[i] = i;
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
  ASSERT_EQ(out.top.size(), static_cast<size_t>(kMaxTopLogprobs));
  for (int32_t i = 0; i < kMaxTopLogprobs; ++i) EXPECT_EQ(out.top[i].token, ids[i]);
  double total = 0.0;
  for (float v : l) total += std::exp(static_cast<double>(v));
  EXPECT_NEAR(out.chosen.logprob, l[17] - std::log(total), 1e-5);
}

TEST(Logprobs, BadArgumentsAreErrorsNamingTheValue) {
  const std::vector<float> l = {0.0f, 1.0f};
  TokenLogprobs out;
  Status st = compute_logprobs(l.data(), 2, 0, 21, &out);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.error().message.find("top_logprobs"), std::string::npos);
  EXPECT_NE(st.error().message.find("21"), std::string::npos);
  EXPECT_FALSE(compute_logprobs(l.data(), 2, 0, -1, &out).ok());
  st = compute_logprobs(l.data(), 2, 2, 1, &out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().code, ErrorCode::kOutOfRange);
}

TEST(Logprobs, SamplerReportsTheRawModelDistributionOverTheRealVocabulary) {
  // Bias, penalties and temperature change what is sampled, not the reported logprobs; the
  // padded row (id 3) is outside the distribution.
  const std::vector<float> l = {std::log(0.25f), std::log(0.25f), std::log(0.5f), 30.0f};
  SamplingParams p;
  p.temperature = 0.3f;
  p.logit_bias = {{0, 50.0f}};
  p.presence_penalty = 1.0f;
  p.vocab_limit = 3;
  auto s = Sampler::create(p, 4);
  ASSERT_TRUE(s.ok());
  s->accept(2);
  TokenLogprobs out;
  ASSERT_TRUE(s->logprobs(l.data(), 4, 0, 3, &out).ok());
  EXPECT_NEAR(out.chosen.logprob, std::log(0.25), 1e-6);
  ASSERT_EQ(out.top.size(), 3u);
  EXPECT_EQ(out.top[0].token, 2);
  EXPECT_NEAR(out.top[0].logprob, std::log(0.5), 1e-6);
  EXPECT_FALSE(s->logprobs(l.data(), 4, 3, 0, &out).ok());  // a padded id is no token
}

}  // namespace
}  // namespace strata
