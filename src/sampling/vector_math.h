// The O(V) kernels of sampling, written as plain loops that the compiler vectorizes (no libm
// call inside): exp of non-positive arguments, fixed-order sums, max, NaN cleaning. Both the
// reference processors and the fused Sampler use them, so the two round identically.
//
// Seeded sampling is reproducible across builds because every operation here is a plain IEEE
// float/double operation in a fixed order. That assumes no floating-point contraction: strata
// builds for baseline x86-64, where GCC has no FMA to contract into. A build that adds -mfma
// or -march=native must give this layer -ffp-contract=off, or seeded outputs change
// (sampling_processors_test checks the flag's effect).
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace strata {

// exp(x) for x <= 0, x = logit - max logit, the only range sampling evaluates. Cody-Waite
// reduction x = n ln2 + r, |r| <= ln2/2, then the degree-7 Taylor polynomial of e^r
// (truncation error < 5e-9) and 2^n built from its exponent bits. Relative error stays
// below 1e-6 (tests/unit/sampling_processors_test.cpp checks it against std::exp);
// exp(0) is exactly 1 and nothing exceeds 1. Below -87 (under 1.7e-38, where float stops being
// normal) the result is 0, as is exp(-inf).
inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693359375f;           // ln 2 split so n * kLn2Hi is exact
  constexpr float kLn2Lo = -2.12194440e-4f;
  constexpr float kRoundMagic = 12582912.0f;       // 1.5 * 2^23: adding it rounds to an integer
  constexpr uint32_t kFloorBits = 0xC2AE0000u;     // bits of -87.0f
  constexpr uint32_t kOneBits = 0x3F800000u;       // bits of 1.0f
  // The selects are on the bits, as unsigned integers: for x <= 0 a larger magnitude has
  // larger bits (and +0 has none), so min() clamps. Float compares would keep the compiler from
  // vectorizing under the default -ftrapping-math.
  const uint32_t xb = std::bit_cast<uint32_t>(x);
  const float xc = std::bit_cast<float>(xb < kFloorBits ? xb : kFloorBits);
  const float t = xc * kLog2e + kRoundMagic;
  const float n = t - kRoundMagic;
  const float r = (xc - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  // n is in [-126, 0]: the low bits of t hold n (two's complement offset by the magic), and
  // 2^n has exponent field n + 127.
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRoundMagic);
  const float scale = std::bit_cast<float>((ni + 127) << 23);
  const uint32_t eb = std::bit_cast<uint32_t>(p * scale);  // >= 0
  const uint32_t capped = eb < kOneBits ? eb : kOneBits;
  const uint32_t keep = xb <= kFloorBits ? 0xFFFFFFFFu : 0u;  // 0 below -87 and for -inf
  return std::bit_cast<float>(capped & keep);
}

// NaN -> -inf, anything else unchanged; on the bits, so loops using it vectorize.
inline float nan_to_neg_inf(float v) {
  const int32_t u = std::bit_cast<int32_t>(v);
  const int32_t magnitude = u & 0x7FFFFFFF;  // signed compare: SSE2 has no unsigned one
  return std::bit_cast<float>(magnitude > 0x7F800000 ? static_cast<int32_t>(0xFF800000u) : u);
}

// w[i] = exp_nonpositive(w[i] - m) for i in [0, n): logits to unnormalized weights in place.
inline void exp_shifted(float* w, int32_t n, float m) {
  for (int32_t i = 0; i < n; ++i) w[i] = exp_nonpositive(w[i] - m);
}

// A double sum over 8 lanes, element i always in lane i % 8, lanes combined in a fixed tree:
// deterministic, and the lanes break the add latency chain. Adding the nonzero elements of an
// array in id order gives bit for bit the sum of the whole array (x + 0.0 == x).
struct LaneSum {
  double lane[8] = {};
  void add(int32_t i, float w) { lane[i & 7] += w; }
  double total() const {
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
};

inline LaneSum lane_sum(const float* w, int32_t n) {
  LaneSum s;
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) s.lane[j] += w[i + j];
  }
  for (int j = 0; j < 8 && i + j < n; ++j) s.lane[j] += w[i + j];  // i is a multiple of 8
  return s;
}

inline double sum_weights(const float* w, int32_t n) { return lane_sum(w, n).total(); }

// Largest of w[0, n) (NaN never wins a comparison), over 8 lanes so it vectorizes.
inline float max_value(const float* w, int32_t n) {
  constexpr float kNegInf = -__builtin_inff();
  float lane[8] = {kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf, kNegInf};
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) lane[j] = w[i + j] > lane[j] ? w[i + j] : lane[j];
  }
  for (; i < n; ++i) lane[0] = w[i] > lane[0] ? w[i] : lane[0];
  float m = lane[0];
  for (int j = 1; j < 8; ++j) m = lane[j] > m ? lane[j] : m;
  return m;
}

// Sum of exp_nonpositive(l[i] - m), NaN counted as -inf (weight 0), without storing the
// weights: blocks of 256 go through a stack buffer so both loops vectorize. Deterministic;
// its rounding differs from sum_weights (block partial sums).
inline double sum_exp_shifted(const float* l, int32_t n, float m) {
  constexpr int32_t kBlock = 256;
  float buf[kBlock];
  LaneSum s;
  for (int32_t i = 0; i < n; i += kBlock) {
    const int32_t len = n - i < kBlock ? n - i : kBlock;
    // Three loops over an L1-resident block: fused into one, GCC's vector code ran 3x slower.
    for (int32_t j = 0; j < len; ++j) buf[j] = nan_to_neg_inf(l[i + j]);
    exp_shifted(buf, len, m);
    const LaneSum part = lane_sum(buf, len);
    for (int k = 0; k < 8; ++k) s.lane[k] += part.lane[k];
  }
  return s.total();
}

}  // namespace strata
