// Each logits processor alone, against values worked out by hand, and the RNG against an
// independent implementation of the published algorithms.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <vector>

#include "sampling/logits_processors.h"
#include "sampling/rng.h"
#include "sampling/vector_math.h"

namespace strata {
namespace {

const float kNegInf = -std::numeric_limits<float>::infinity();

std::vector<float> logs_of(const std::vector<double>& probs) {
  std::vector<float> out;
  for (double p : probs) out.push_back(static_cast<float>(std::log(p)));
  return out;
}

std::vector<bool> kept(const std::vector<float>& logits) {
  std::vector<bool> out;
  for (float l : logits) out.push_back(l != kNegInf);
  return out;
}

TEST(Rng, Splitmix64MatchesThePublishedSequence) {
  uint64_t state = 0;
  EXPECT_EQ(splitmix64_next(&state), 0xE220A8397B1DCDAFull);
  EXPECT_EQ(splitmix64_next(&state), 0x6E789E6AA1B965F4ull);
  EXPECT_EQ(splitmix64_next(&state), 0x06C45D188009454Full);
}

TEST(Rng, Xoshiro256StarStarSeededBySplitmixMatchesAReferenceImplementation) {
  // Expected values from an independent Python implementation of splitmix64 + xoshiro256**.
  Xoshiro256 a(0);
  EXPECT_EQ(a.next_u64(), 0x99EC5F36CB75F2B4ull);
  EXPECT_EQ(a.next_u64(), 0xBF6E1F784956452Aull);
  EXPECT_EQ(a.next_u64(), 0x1A5F849D4933E6E0ull);
  EXPECT_EQ(a.next_u64(), 0x6AA594F1262D2D2Cull);
  Xoshiro256 b(42);
  EXPECT_EQ(b.next_u64(), 0x15780B2E0C2EC716ull);
  EXPECT_EQ(b.next_u64(), 0x6104D9866D113A7Eull);
  EXPECT_EQ(b.next_u64(), 0xAE17533239E499A1ull);
  EXPECT_EQ(b.next_u64(), 0xECB8AD4703B360A1ull);
}

TEST(Rng, DoublesAreInTheUnitIntervalAndStateRoundTrips) {
  Xoshiro256 a(7);
  for (int i = 0; i < 1000; ++i) a.next_u64();
  Xoshiro256 b = Xoshiro256::from_state(a.state());
  for (int i = 0; i < 1000; ++i) {
    const double u = a.next_double();
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    EXPECT_EQ(u, b.next_double());
  }
}

TEST(VectorMath, ExpNonpositiveIsWithinARelativeMicroOfStdExp) {
  // Every 97th float of (-87, 0] (about 11M values) plus the edges.
  double worst = 0.0;
  uint32_t bits = std::bit_cast<uint32_t>(-0.0f);
  const uint32_t last = std::bit_cast<uint32_t>(-87.0f);
  for (; bits < last; bits += 97) {
    const float x = std::bit_cast<float>(bits);
    const double expected = std::exp(static_cast<double>(x));
    const float got = exp_nonpositive(x);
    ASSERT_LE(got, 1.0f) << x;
    worst = std::max(worst, std::fabs(got - expected) / expected);
  }
  EXPECT_LT(worst, 1e-6);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-87.5f), 0.0f);
  EXPECT_EQ(exp_nonpositive(kNegInf), 0.0f);
  EXPECT_NEAR(exp_nonpositive(-1.0f), std::exp(-1.0), 1e-7);
}

TEST(VectorMath, BuiltWithoutFloatingPointContraction) {
  // (1 + 2^-12)^2 - (1 + 2^-11) is 0 with the product rounded (ties to even) and 2^-24 when
  // fused into an fma. A fused build would make seeded sampling differ from other builds.
  volatile float va = 1.0f + 0x1p-12f, vc = -(1.0f + 0x1p-11f);
  const float a = va, c = vc;
  EXPECT_EQ(a * a + c, 0.0f) << "compiled with floating-point contraction: add -ffp-contract=off";
}

TEST(VectorMath, SumsMaxAndNanCleaning) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> w(1003);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>((i * 7919) % 1000) / 1000.0f;
  double plain = 0.0;
  for (float v : w) plain += v;
  EXPECT_NEAR(sum_weights(w.data(), 1003), plain, 1e-9);
  // Adding only the nonzero entries by id gives the whole-array sum bit for bit.
  w[5] = w[500] = w[1001] = 0.0f;
  LaneSum by_id;
  for (int32_t i = 0; i < 1003; ++i) {
    if (w[i] != 0.0f) by_id.add(i, w[i]);
  }
  EXPECT_EQ(by_id.total(), sum_weights(w.data(), 1003));
  w[700] = 3.0f;
  w[3] = nan;
  EXPECT_EQ(max_value(w.data(), 1003), 3.0f);
  EXPECT_EQ(nan_to_neg_inf(nan), kNegInf);
  EXPECT_EQ(nan_to_neg_inf(-nan), kNegInf);
  EXPECT_EQ(nan_to_neg_inf(2.5f), 2.5f);
  EXPECT_EQ(nan_to_neg_inf(kNegInf), kNegInf);
  std::vector<float> l = {0.0f, std::log(3.0f), nan, kNegInf, std::log(4.0f)};
  EXPECT_NEAR(sum_exp_shifted(l.data(), 5, std::log(4.0f)), 2.0, 1e-6);  // (1 + 3 + 4) / 4
}

TEST(LogitBias, AddsToTheNamedIdsOnly) {
  std::vector<float> l = {1.0f, 2.0f, 3.0f, 4.0f};
  std::vector<std::pair<int32_t, float>> bias = {{0, 5.0f}, {2, -1.0f}, {7, 9.0f}};  // 7: outside, ignored
  apply_logit_bias(l.data(), 4, bias);
  EXPECT_EQ(l, (std::vector<float>{6.0f, 2.0f, 2.0f, 4.0f}));
}

TEST(RepetitionPenalty, DividesPositiveAndMultipliesNegativeLogitsOfSeenIdsOnce) {
  std::vector<float> l = {2.0f, -2.0f, 3.0f, 0.0f, -1.0f};
  const std::vector<int32_t> seen = {0, 1, 3, 12};  // 12: outside, ignored
  apply_repetition_penalty(l.data(), 5, seen, 2.0f);
  EXPECT_EQ(l, (std::vector<float>{1.0f, -4.0f, 3.0f, 0.0f, -1.0f}));
  // A penalty below 1 rewards repetition the same way.
  std::vector<float> r = {2.0f, -2.0f};
  const std::vector<int32_t> both = {0, 1};
  apply_repetition_penalty(r.data(), 2, both, 0.5f);
  EXPECT_EQ(r, (std::vector<float>{4.0f, -1.0f}));
}

TEST(PresenceFrequencyPenalty, SubtractsPresenceOnceAndFrequencyPerOccurrence) {
  std::vector<float> l = {1.0f, 1.0f, 1.0f};
  const std::vector<std::pair<int32_t, int32_t>> counts = {{0, 3}, {2, 1}};
  apply_presence_frequency_penalty(l.data(), 3, counts, 0.5f, 0.25f);
  EXPECT_FLOAT_EQ(l[0], 1.0f - 0.5f - 3 * 0.25f);
  EXPECT_FLOAT_EQ(l[1], 1.0f);
  EXPECT_FLOAT_EQ(l[2], 1.0f - 0.5f - 0.25f);
  std::vector<float> neg = {1.0f};
  const std::vector<std::pair<int32_t, int32_t>> one = {{0, 2}};
  apply_presence_frequency_penalty(neg.data(), 1, one, -1.0f, -0.5f);  // negative: encourages
  EXPECT_FLOAT_EQ(neg[0], 3.0f);
}

TEST(Temperature, DividesEveryLogit) {
  std::vector<float> l = {1.0f, -2.0f, 0.5f};
  apply_temperature(l.data(), 3, 0.5f);
  EXPECT_EQ(l, (std::vector<float>{2.0f, -4.0f, 1.0f}));
}

TEST(TopK, KeepsTheKLargestAndEveryTieOfTheKth) {
  std::vector<float> l = {1.0f, 5.0f, 3.0f, 4.0f, 2.0f};
  apply_top_k(l.data(), 5, 2);
  EXPECT_EQ(kept(l), (std::vector<bool>{false, true, false, true, false}));
  EXPECT_EQ(l[1], 5.0f);
  std::vector<float> ties = {1.0f, 3.0f, 2.0f, 3.0f, 2.0f};
  apply_top_k(ties.data(), 5, 3);  // the 3rd largest is 2, held by ids 2 and 4: both stay
  EXPECT_EQ(kept(ties), (std::vector<bool>{false, true, true, true, true}));
  std::vector<float> off = {1.0f, 2.0f};
  apply_top_k(off.data(), 2, 0);
  apply_top_k(off.data(), 2, 2);
  EXPECT_EQ(kept(off), (std::vector<bool>{true, true}));
}

TEST(TopP, KeepsTheSmallestPrefixReachingP) {
  // Probabilities 0.3, 0.1, 0.4, 0.2 at ids 0..3: order by probability is 2, 0, 3, 1.
  const std::vector<float> base = logs_of({0.3, 0.1, 0.4, 0.2});
  auto run = [&](float p) {
    std::vector<float> l = base;
    apply_top_p(l.data(), 4, p);
    return kept(l);
  };
  EXPECT_EQ(run(0.3f), (std::vector<bool>{false, false, true, false}));   // 0.4 >= 0.3
  EXPECT_EQ(run(0.65f), (std::vector<bool>{true, false, true, false}));   // 0.4 < 0.65 <= 0.7
  EXPECT_EQ(run(0.75f), (std::vector<bool>{true, false, true, true}));    // 0.7 < 0.75 <= 0.9
  EXPECT_EQ(run(0.95f), (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(run(1e-6f), (std::vector<bool>{false, false, true, false}));  // at least one
}

TEST(TopP, EqualProbabilitiesAreOrderedByIdSoTheSetIsDeterministic) {
  std::vector<float> l = {0.0f, 0.0f, 0.0f, 0.0f};
  apply_top_p(l.data(), 4, 0.4f);  // needs two of four equal tokens: the two lowest ids
  EXPECT_EQ(kept(l), (std::vector<bool>{true, true, false, false}));
}

TEST(MinP, KeepsProbabilitiesAtLeastMinPTimesTheMaximum) {
  const std::vector<float> base = logs_of({0.3, 0.1, 0.4, 0.2});
  auto run = [&](float min_p) {
    std::vector<float> l = base;
    apply_min_p(l.data(), 4, min_p);
    return kept(l);
  };
  EXPECT_EQ(run(0.6f), (std::vector<bool>{true, false, true, false}));   // 0.75 >= 0.6 > 0.5
  EXPECT_EQ(run(0.45f), (std::vector<bool>{true, false, true, true}));   // 0.5 >= 0.45 > 0.25
  EXPECT_EQ(run(0.2f), (std::vector<bool>{true, true, true, true}));
  EXPECT_EQ(run(1.0f), (std::vector<bool>{false, false, true, false}));
}

TEST(Softmax, MatchesClosedFormAndIgnoresRemovedTokens) {
  std::vector<float> l = {0.0f, std::log(3.0f), kNegInf, std::log(4.0f)};
  std::vector<float> p(4);
  softmax(l.data(), 4, p.data());
  EXPECT_NEAR(p[0], 0.125, 1e-7);
  EXPECT_NEAR(p[1], 0.375, 1e-7);
  EXPECT_EQ(p[2], 0.0f);
  EXPECT_NEAR(p[3], 0.5, 1e-7);
}

TEST(ApplyAll, TopPSeesTheDistributionLeftByTopKAndMinPComesLast) {
  // Probabilities 0.4, 0.3, 0.2, 0.1. With top-k 3 the renormalized top two hold 0.7/0.9 =
  // 0.78 >= 0.72; without top-k they hold only 0.7 < 0.72 and top-p needs a third token.
  const std::vector<float> base = logs_of({0.4, 0.3, 0.2, 0.1});
  SamplingParams p;
  p.top_p = 0.72f;
  std::vector<float> l = base;
  apply_all(l.data(), 4, p, {}, {});
  EXPECT_EQ(kept(l), (std::vector<bool>{true, true, true, false}));
  p.top_k = 3;
  l = base;
  apply_all(l.data(), 4, p, {}, {});
  EXPECT_EQ(kept(l), (std::vector<bool>{true, true, false, false}));
  // top-p 0.95 keeps all four; min-p 0.45 then drops 0.1 (0.25 of the max).
  p = {};
  p.top_p = 0.95f;
  p.min_p = 0.45f;
  l = base;
  apply_all(l.data(), 4, p, {}, {});
  EXPECT_EQ(kept(l), (std::vector<bool>{true, true, true, false}));
}

TEST(ApplyAll, BiasComesBeforeTheRepetitionPenalty) {
  // bias then penalty: (1 + 3) / 2 = 2; the other order would give 1 / 2 + 3 = 3.5.
  std::vector<float> l = {1.0f, 0.0f};
  SamplingParams p;
  p.logit_bias = {{0, 3.0f}};
  p.repetition_penalty = 2.0f;
  p.temperature = 1.0f;
  const std::vector<int32_t> seen = {0};
  apply_all(l.data(), 2, p, seen, {});
  EXPECT_FLOAT_EQ(l[0], 2.0f);
}

}  // namespace
}  // namespace strata
