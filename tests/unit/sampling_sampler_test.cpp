// Sampler end to end: greedy, the kept sets of the filters (by sampling), the distribution of
// temperature sampling (chi-square), parity of the fused path with the reference processors,
// the vocab limit, reproducibility and save/restore.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <vector>

#include "core/check.h"
#include "sampling/logits_processors.h"
#include "sampling/sampler.h"

namespace strata {
namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

Sampler make(const SamplingParams& p, int32_t vocab, std::vector<int32_t> prompt = {}) {
  auto r = Sampler::create(p, vocab, prompt);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return std::move(r).value();
}

std::vector<float> logs_of(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

// Every id drawn over many seeds and draws: the empirical support of the kept set.
std::set<int32_t> support(SamplingParams p, const std::vector<float>& logits, int seeds = 200, int draws = 25) {
  std::set<int32_t> ids;
  const int32_t n = static_cast<int32_t>(logits.size());
  for (int s = 0; s < seeds; ++s) {
    p.seed = 1000 + s;
    Sampler sampler = make(p, n);
    for (int d = 0; d < draws; ++d) ids.insert(sampler.sample(logits.data(), n));
  }
  return ids;
}

// Logits with a realistic shape: a few strong tokens over a long tail.
std::vector<float> random_logits(Xoshiro256& rng, int32_t n) {
  std::vector<float> l(n);
  for (auto& v : l) {
    const double u1 = rng.next_double() + 1e-12, u2 = rng.next_double();
    v = static_cast<float>(2.5 * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
  for (int j = 0; j < 5; ++j) l[rng.next_u64() % n] += 8.0f;
  return l;
}

TEST(SamplerGreedy, ArgmaxWithLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = 2;  // filters never change the argmax
  p.top_p = 0.1f;
  Sampler s = make(p, 5);
  const std::vector<float> l = {1.0f, 3.0f, 2.0f, 3.0f, -1.0f};
  EXPECT_EQ(s.sample(l.data(), 5), 1);
  EXPECT_EQ(s.sample(l.data(), 5), 1);
}

TEST(SamplerGreedy, BiasAndPenaltiesApplyBeforeTheArgmax) {
  const std::vector<float> l = {1.0f, 3.0f, 2.9f, 0.0f};
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{3, 3.5f}};
  EXPECT_EQ(make(p, 4).sample(l.data(), 4), 3);

  p = {};
  p.temperature = 0.0f;
  p.presence_penalty = 0.5f;
  Sampler presence = make(p, 4);
  EXPECT_EQ(presence.sample(l.data(), 4), 1);
  presence.accept(1);
  EXPECT_EQ(presence.sample(l.data(), 4), 2);

  p = {};
  p.temperature = 0.0f;
  p.frequency_penalty = 0.4f;
  const std::vector<float> f = {2.0f, 1.0f};
  Sampler frequency = make(p, 2);
  frequency.accept(0);
  frequency.accept(0);
  EXPECT_EQ(frequency.sample(f.data(), 2), 0);  // 2 - 0.8 = 1.2 > 1
  frequency.accept(0);
  EXPECT_EQ(frequency.sample(f.data(), 2), 1);  // 2 - 1.2 = 0.8 < 1
}

TEST(SamplerGreedy, RepetitionPenaltyCoversThePromptButPresenceDoesNot) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.repetition_penalty = 2.0f;
  const std::vector<float> pos = {3.0f, 2.0f};
  EXPECT_EQ(make(p, 2, {0}).sample(pos.data(), 2), 1);  // 3 / 2 < 2
  const std::vector<float> neg = {-1.0f, -1.5f};
  EXPECT_EQ(make(p, 2, {0}).sample(neg.data(), 2), 1);  // -1 * 2 < -1.5
  Sampler generated = make(p, 2);
  EXPECT_EQ(generated.sample(pos.data(), 2), 0);
  generated.accept(0);
  EXPECT_EQ(generated.sample(pos.data(), 2), 1);

  p = {};
  p.temperature = 0.0f;
  p.presence_penalty = 2.0f;
  const std::vector<float> l = {2.0f, 1.9f};
  EXPECT_EQ(make(p, 2, {0}).sample(l.data(), 2), 0);  // prompt ids carry no presence penalty
}

TEST(SamplerSupport, TopKKeepsExactlyTheKLargestAndTheirTies) {
  const std::vector<float> l = {0.5f, 1.0f, 0.9f, -0.2f, 0.8f, 0.0f};
  SamplingParams p;
  p.top_k = 3;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{1, 2, 4}));
  p.top_k = 1;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{1}));
  const std::vector<float> ties = {1.0f, 3.0f, 2.0f, 3.0f, 2.0f, 0.0f};
  p.top_k = 3;
  EXPECT_EQ(support(p, ties), (std::set<int32_t>{1, 2, 3, 4}));
  p.top_k = 0;
  EXPECT_EQ(support(p, l).size(), 6u);
}

TEST(SamplerSupport, TopPKeepsTheNucleus) {
  const std::vector<float> l = logs_of({0.3, 0.1, 0.4, 0.2});
  SamplingParams p;
  p.top_p = 0.3f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{2}));
  p.top_p = 0.65f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 2}));
  p.top_p = 0.75f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 2, 3}));
  p.top_p = 0.95f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1, 2, 3}));
  // Temperature first: at T = 0.5 the probabilities become 9:1:16:4 / 30 (0.30, 0.03, 0.53,
  // 0.13), so 0.8 is reached by ids 2 and 0 (0.83) and 0.9 needs id 3 as well (0.97).
  p.temperature = 0.5f;
  p.top_p = 0.9f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 2, 3}));
  p.top_p = 0.8f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 2}));
}

TEST(SamplerSupport, TopPAfterTopKAndMinPLast) {
  const std::vector<float> l = logs_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p;
  p.top_p = 0.72f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1, 2}));
  p.top_k = 3;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1}));
  p = {};
  p.top_p = 0.95f;
  p.min_p = 0.45f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerSupport, MinPKeepsTokensWithinTheRatioOfTheMaximum) {
  const std::vector<float> l = logs_of({0.3, 0.1, 0.4, 0.2});
  SamplingParams p;
  p.min_p = 0.6f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 2}));
  p.min_p = 0.45f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 2, 3}));
  p.min_p = 0.2f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 1, 2, 3}));
  p.top_k = 2;  // with top-k on as well
  EXPECT_EQ(support(p, l), (std::set<int32_t>{0, 2}));
}

TEST(SamplerSupport, TopPOnALargeVocabularyMatchesTheReferenceSet) {
  // Exercises the bucketed nucleus bound over a 50k vocabulary with a long tail.
  Xoshiro256 rng(3);
  const int32_t n = 50000;
  std::vector<float> l = random_logits(rng, n);
  for (float top_p : {0.5f, 0.9f, 0.99f}) {
    SamplingParams p;
    p.top_p = top_p;
    std::vector<float> ref = l;
    apply_top_p(ref.data(), n, top_p);
    std::set<int32_t> expected;
    for (int32_t i = 0; i < n; ++i) {
      if (ref[i] != kNegInf) expected.insert(i);
    }
    Sampler s = make(p, n);
    std::vector<float> probs(n);
    s.distribution(l.data(), n, probs.data());
    std::set<int32_t> got;
    for (int32_t i = 0; i < n; ++i) {
      if (probs[i] > 0.0f) got.insert(i);
    }
    EXPECT_EQ(got, expected) << "top_p " << top_p;
    for (int d = 0; d < 200; ++d) EXPECT_TRUE(expected.count(s.sample(l.data(), n)));
  }
}

TEST(SamplerSupport, TopPOverManyEqualWeightsKeepsTheLowestIds) {
  // 20000 equal logits with a few heavier ones: the boundary range is thousands of tokens of
  // one weight, which the radix refinement cannot split; ties must go to the lowest ids.
  const int32_t n = 20000;
  std::vector<float> l(n, 0.0f);
  l[123] = l[17000] = 3.0f;
  l[5] = 1.5f;
  for (float top_p : {0.3f, 0.5f, 0.77f}) {
    for (float min_p : {0.0f, 0.04f, 0.5f}) {
      SamplingParams p;
      p.top_p = top_p;
      p.min_p = min_p;
      std::vector<float> ref = l;
      apply_top_p(ref.data(), n, top_p);
      apply_min_p(ref.data(), n, min_p);
      Sampler s = make(p, n);
      std::vector<float> probs(n);
      s.distribution(l.data(), n, probs.data());
      int32_t kept = 0;
      for (int32_t i = 0; i < n; ++i) {
        ASSERT_EQ(probs[i] > 0.0f, ref[i] != kNegInf) << "top_p " << top_p << " min_p " << min_p << " id " << i;
        kept += probs[i] > 0.0f;
      }
      EXPECT_GT(kept, min_p < 0.5f ? 1000 : 1);  // 0.5 keeps only the two logits of 3
      std::set<int32_t> drawn;
      for (int d = 0; d < 300; ++d) drawn.insert(s.sample(l.data(), n));
      for (int32_t t : drawn) EXPECT_NE(ref[t], kNegInf) << t;
    }
  }
}

// Chi-square of draws from one seeded sampler against the softmax at temperature T.
double chi_square(const std::vector<int64_t>& counts, const std::vector<double>& probs, int64_t total) {
  double chi2 = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = probs[i] * static_cast<double>(total);
    chi2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return chi2;
}

std::vector<double> softmax_at(const std::vector<float>& l, double t) {
  std::vector<double> p(l.size());
  double z = 0.0;
  for (size_t i = 0; i < l.size(); ++i) z += p[i] = std::exp(l[i] / t);
  for (double& v : p) v /= z;
  return p;
}

TEST(SamplerDistribution, TemperatureSamplingMatchesSoftmaxByChiSquare) {
  const std::vector<float> l = {0.5f, 1.0f, -0.3f, 2.0f, 0.0f, 1.2f};
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 1234;
  Sampler s = make(p, 6);
  const int64_t total = 200000;
  std::vector<int64_t> counts(6, 0);
  for (int64_t i = 0; i < total; ++i) ++counts[s.sample(l.data(), 6)];
  // 5 degrees of freedom: P(chi2 > 20.52) = 0.001 under the right distribution.
  const double critical = 20.52;
  EXPECT_LT(chi_square(counts, softmax_at(l, 0.8), total), critical);
  // The bound has power: the same draws are far from the T = 1 distribution.
  EXPECT_GT(chi_square(counts, softmax_at(l, 1.0), total), critical);
}

TEST(SamplerDistribution, FilteredSamplingIsProportionalWithinTheKeptSet) {
  // top-k 3 over probabilities 0.4, 0.3, 0.2, 0.1: draws follow 4:3:2 among ids 0..2.
  const std::vector<float> l = logs_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p;
  p.top_k = 3;
  p.seed = 99;
  Sampler s = make(p, 4);
  const int64_t total = 90000;
  std::vector<int64_t> counts(3, 0);
  for (int64_t i = 0; i < total; ++i) {
    const int32_t t = s.sample(l.data(), 4);
    ASSERT_LT(t, 3);
    ++counts[t];
  }
  // 2 degrees of freedom: P(chi2 > 13.82) = 0.001.
  EXPECT_LT(chi_square(counts, {4.0 / 9, 3.0 / 9, 2.0 / 9}, total), 13.82);
}

TEST(SamplerDistribution, FusedPathMatchesTheReferenceProcessors) {
  Xoshiro256 rng(11);
  struct Case {
    float temperature;
    int32_t top_k;
    float top_p, min_p, repetition, presence, frequency;
  };
  const std::vector<Case> cases = {
      {1.0f, 0, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f},     {0.7f, 40, 1.0f, 0.0f, 1.0f, 0.0f, 0.0f},
      {1.3f, 0, 0.9f, 0.0f, 1.0f, 0.0f, 0.0f},     {1.0f, 0, 1.0f, 0.05f, 1.0f, 0.0f, 0.0f},
      {0.9f, 50, 0.8f, 0.1f, 1.2f, 0.5f, 0.3f},    {1.0f, 700, 0.95f, 0.0f, 1.0f, 0.0f, 0.0f},
      {2.0f, 0, 0.97f, 0.02f, 0.8f, -0.5f, 1.0f},  {0.5f, 1000, 1.0f, 0.0f, 1.1f, 1.0f, 0.0f},
      {1.0f, 5, 1.0f, 0.3f, 1.0f, 0.0f, 0.0f},
  };
  const int32_t n = 3000;
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    SamplingParams p;
    p.temperature = k.temperature;
    p.top_k = k.top_k;
    p.top_p = k.top_p;
    p.min_p = k.min_p;
    p.repetition_penalty = k.repetition;
    p.presence_penalty = k.presence;
    p.frequency_penalty = k.frequency;
    p.logit_bias = {{7, 5.0f}, {8, -3.0f}};
    const std::vector<int32_t> prompt = {3, 7, 7, 2999};
    Sampler s = make(p, n, prompt);
    const std::vector<int32_t> generated = {7, 100, 100, 5, 100};
    for (int32_t t : generated) s.accept(t);
    // The history as the reference processors take it, built independently here.
    std::vector<int32_t> seen;
    if (k.repetition != 1.0f) seen = {3, 7, 2999, 100, 5};
    const std::vector<std::pair<int32_t, int32_t>> counts = {{7, 1}, {100, 3}, {5, 1}};

    for (int round = 0; round < 3; ++round) {
      std::vector<float> l = random_logits(rng, n);
      l[100] = 9.0f;  // make the penalties matter
      std::vector<float> ref = l;
      apply_all(ref.data(), n, p, seen, counts);
      std::vector<float> expected(n), got(n);
      softmax(ref.data(), n, expected.data());
      s.distribution(l.data(), n, got.data());
      for (int32_t i = 0; i < n; ++i) {
        ASSERT_EQ(got[i] > 0.0f, expected[i] > 0.0f) << "case " << c << " id " << i;
        ASSERT_NEAR(got[i], expected[i], 1e-6f + 1e-5f * expected[i]) << "case " << c << " id " << i;
      }
    }
  }
}

TEST(SamplerVocabLimit, PaddedRowsAreNeverSampled) {
  const int32_t n = 128, limit = 100;
  Xoshiro256 rng(5);
  std::vector<float> l = random_logits(rng, n);
  for (int32_t i = limit; i < n; ++i) l[i] = 50.0f;  // padded rows with the largest logits
  std::vector<SamplingParams> variants(6);
  variants[0].temperature = 0.0f;
  variants[1].temperature = 1.0f;
  variants[2].top_k = 5;
  variants[3].top_p = 0.5f;
  variants[4].min_p = 0.1f;
  variants[5].temperature = 5.0f;
  for (auto& p : variants) {
    p.vocab_limit = limit;
    std::set<int32_t> ids = support(p, l, 50, 20);
    EXPECT_LT(*ids.rbegin(), limit);
    Sampler s = make(p, n);
    std::vector<float> probs(n);
    s.distribution(l.data(), n, probs.data());
    for (int32_t i = limit; i < n; ++i) EXPECT_EQ(probs[i], 0.0f);
  }
  SamplingParams unlimited;
  unlimited.temperature = 0.0f;
  EXPECT_GE(make(unlimited, n).sample(l.data(), n), limit);  // the test data would catch a leak
}

TEST(SamplerRobustness, CallerLogitsAreUntouchedAndNanIsNeverDrawn) {
  std::vector<float> l = {1.0f, std::numeric_limits<float>::quiet_NaN(), 0.5f, kNegInf};
  const std::vector<float> copy = l;
  SamplingParams p;
  p.repetition_penalty = 1.5f;
  p.logit_bias = {{0, 1.0f}};
  Sampler s = make(p, 4, {0});
  std::set<int32_t> ids;
  for (int i = 0; i < 500; ++i) ids.insert(s.sample(l.data(), 4));
  EXPECT_EQ(ids, (std::set<int32_t>{0, 2}));
  for (size_t i = 0; i < l.size(); ++i) EXPECT_EQ(std::memcmp(&l[i], &copy[i], sizeof(float)), 0);
}

TEST(SamplerRobustness, PlusInfinityLogitsShareAllTheMass) {
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> l = {5.0f, inf, 7.0f, inf};
  SamplingParams p;
  p.top_p = 0.5f;
  EXPECT_EQ(support(p, l), (std::set<int32_t>{1, 3}));
  std::vector<float> probs(4);
  make(p, 4).distribution(l.data(), 4, probs.data());
  EXPECT_EQ(probs, (std::vector<float>{0.0f, 0.5f, 0.0f, 0.5f}));
}

TEST(SamplerRobustness, ATemperatureThatOverflowsTheLogitsKeepsOnlyTheMaximum) {
  SamplingParams p;
  p.temperature = 1e-37f;  // 40 / 1e-37 and 50 / 1e-37 both overflow float (max 3.4e38)
  EXPECT_EQ(support(p, {1.0f, 50.0f, 40.0f, 50.0f}), (std::set<int32_t>{1, 3}));
  EXPECT_EQ(support(p, {1.0f, 50.0f, 49.9f, -5.0f}), (std::set<int32_t>{1}));
  p.temperature = 1e-30f;  // no overflow: the softmax itself is one-hot
  EXPECT_EQ(support(p, {1.0f, 50.0f, 49.9f, -5.0f}), (std::set<int32_t>{1}));
}

TEST(SamplerRobustness, ARowWithoutAnyFiniteLogitIsAnInvariantError) {
  const std::vector<float> l(4, kNegInf);
  Sampler s = make(SamplingParams{}, 4);
  EXPECT_THROW(s.sample(l.data(), 4), InvariantError);
}

// A generation: logits depend on the previous token so a divergence would propagate.
std::vector<int32_t> generate(Sampler& s, int steps, uint64_t logits_seed, int32_t n) {
  Xoshiro256 rng(logits_seed);
  std::vector<int32_t> out;
  for (int i = 0; i < steps; ++i) {
    std::vector<float> l = random_logits(rng, n);
    if (!out.empty()) l[out.back()] += 1.0f;
    const int32_t t = s.sample(l.data(), n);
    s.accept(t);
    out.push_back(t);
  }
  return out;
}

SamplingParams busy_params(uint64_t seed) {
  SamplingParams p;
  p.temperature = 1.1f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.min_p = 0.01f;
  p.repetition_penalty = 1.1f;
  p.presence_penalty = 0.3f;
  p.frequency_penalty = 0.2f;
  p.logit_bias = {{3, 2.0f}};
  p.seed = seed;
  p.has_seed = true;
  p.vocab_limit = 900;
  return p;
}

TEST(SamplerReproducibility, SameSeedSameTokensDifferentSeedDifferentTokens) {
  const int32_t n = 1000;
  Sampler a = make(busy_params(77), n, {1, 2, 3});
  Sampler b = make(busy_params(77), n, {1, 2, 3});
  Sampler c = make(busy_params(78), n, {1, 2, 3});
  const auto ta = generate(a, 200, 9, n), tb = generate(b, 200, 9, n), tc = generate(c, 200, 9, n);
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
  for (int32_t t : ta) EXPECT_LT(t, 900);
}

TEST(SamplerReproducibility, SaveRestoreMidSequenceContinuesIdentically) {
  const int32_t n = 1000;
  for (bool greedy : {false, true}) {
    SamplingParams p = busy_params(2024);
    if (greedy) p.temperature = 0.0f;
    Sampler whole = make(p, n, {5, 6, 5});
    Xoshiro256 logits_rng(31);
    std::vector<std::vector<float>> rows;
    for (int i = 0; i < 150; ++i) rows.push_back(random_logits(logits_rng, n));
    std::vector<int32_t> expected;
    for (auto& row : rows) {
      expected.push_back(whole.sample(row.data(), n));
      whole.accept(expected.back());
    }
    Sampler first = make(p, n, {5, 6, 5});
    std::vector<int32_t> got;
    for (int i = 0; i < 60; ++i) {
      got.push_back(first.sample(rows[i].data(), n));
      first.accept(got.back());
    }
    const std::string bytes = first.save();
    auto restored = Sampler::restore(bytes);
    ASSERT_TRUE(restored.ok()) << restored.error().to_string();
    Sampler second = std::move(restored).value();
    EXPECT_EQ(second.save(), bytes);
    EXPECT_EQ(second.n_accepted(), 60);
    for (int i = 60; i < 150; ++i) {
      got.push_back(second.sample(rows[i].data(), n));
      second.accept(got.back());
    }
    EXPECT_EQ(got, expected) << (greedy ? "greedy" : "sampled");
    EXPECT_EQ(second.save(), whole.save());
  }
}

TEST(SamplerState, CorruptBytesAreErrorsNeverCrashes) {
  Sampler s = make(busy_params(1), 1000, {1, 2});
  s.accept(4);
  s.accept(4);
  s.accept(9);
  const std::string bytes = s.save();
  for (size_t len = 0; len < bytes.size(); ++len) {
    auto r = Sampler::restore(std::string_view(bytes).substr(0, len));
    ASSERT_FALSE(r.ok()) << "prefix of " << len << " bytes accepted";
    EXPECT_EQ(r.error().code, ErrorCode::kCorrupt);
  }
  EXPECT_FALSE(Sampler::restore(bytes + "x").ok());
  std::string bad_magic = bytes;
  bad_magic[0] = 'X';
  EXPECT_NE(Sampler::restore(bad_magic).error().message.find("magic"), std::string::npos);
  // Corrupt the temperature's sign bit (first params byte after magic and version).
  std::string bad_param = bytes;
  bad_param[12 + 3] = static_cast<char>(bad_param[12 + 3] | 0x80);
  auto r = Sampler::restore(bad_param);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("temperature"), std::string::npos) << r.error().message;
  // Flip one count: the counts no longer sum to the accepted tokens.
  std::string bad_count = bytes;
  bad_count[bytes.size() - 1] = static_cast<char>(bad_count[bytes.size() - 1] + 1);
  EXPECT_FALSE(Sampler::restore(bad_count).ok());
}

TEST(SamplerCreate, InvalidParamsAreRejected) {
  SamplingParams p;
  p.top_p = 2.0f;
  auto r = Sampler::create(p, 100);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("top_p"), std::string::npos);
}

}  // namespace
}  // namespace strata
