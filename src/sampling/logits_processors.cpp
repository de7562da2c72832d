#include "sampling/logits_processors.h"

#include "sampling/vector_math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

namespace strata {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

float max_of(const float* logits, int32_t n) { return max_value(logits, n); }

}  // namespace

void apply_logit_bias(float* logits, int32_t n, std::span<const std::pair<int32_t, float>> bias) {
  for (const auto& [id, b] : bias) {
    if (id >= 0 && id < n) logits[id] += b;
  }
}

void apply_repetition_penalty(float* logits, int32_t n, std::span<const int32_t> seen_ids, float penalty) {
  if (penalty == 1.0f) return;
  for (int32_t id : seen_ids) {
    if (id >= 0 && id < n) logits[id] = repetition_penalized(logits[id], penalty);
  }
}

void apply_presence_frequency_penalty(float* logits, int32_t n,
                                      std::span<const std::pair<int32_t, int32_t>> counts,
                                      float presence, float frequency) {
  if (presence == 0.0f && frequency == 0.0f) return;
  for (const auto& [id, count] : counts) {
    if (id < 0 || id >= n || count <= 0) continue;
    logits[id] -= frequency * static_cast<float>(count) + presence;
  }
}

void apply_temperature(float* logits, int32_t n, float temperature) {
  for (int32_t i = 0; i < n; ++i) logits[i] /= temperature;
}

void apply_top_k(float* logits, int32_t n, int32_t k) {
  if (k <= 0 || k >= n) return;
  std::vector<float> sorted(logits, logits + n);
  std::nth_element(sorted.begin(), sorted.begin() + (k - 1), sorted.end(), std::greater<float>());
  const float kth = sorted[k - 1];
  for (int32_t i = 0; i < n; ++i) {
    if (logits[i] < kth) logits[i] = kNegInf;
  }
}

void apply_top_p(float* logits, int32_t n, float p) {
  if (p >= 1.0f) return;
  const float m = max_of(logits, n);
  if (m == kNegInf) return;
  std::vector<float> weights(logits, logits + n);
  exp_shifted(weights.data(), n, m);
  const double total = sum_weights(weights.data(), n);
  std::vector<WeightedToken> order(n);
  for (int32_t i = 0; i < n; ++i) order[i] = {weights[i], i};
  std::sort(order.begin(), order.end(), heavier);
  const double target = static_cast<double>(p) * total;
  double cum = 0.0;
  int32_t keep = n;
  for (int32_t j = 0; j < n; ++j) {
    cum += order[j].weight;
    if (cum >= target) {
      keep = j + 1;
      break;
    }
  }
  for (int32_t j = keep; j < n; ++j) logits[order[j].id] = kNegInf;
}

void apply_min_p(float* logits, int32_t n, float min_p) {
  if (min_p <= 0.0f) return;
  const float m = max_of(logits, n);
  if (m == kNegInf) return;
  for (int32_t i = 0; i < n; ++i) {
    if (!(exp_nonpositive(logits[i] - m) >= min_p)) logits[i] = kNegInf;
  }
}

void softmax(const float* logits, int32_t n, float* probs) {
  const float m = max_of(logits, n);
  if (m == kNegInf) {
    std::fill(probs, probs + n, 0.0f);
    return;
  }
  std::copy(logits, logits + n, probs);
  exp_shifted(probs, n, m);
  const double total = sum_weights(probs, n);
  for (int32_t i = 0; i < n; ++i) probs[i] = total > 0.0 ? static_cast<float>(probs[i] / total) : 0.0f;
}

void apply_all(float* logits, int32_t n, const SamplingParams& params, std::span<const int32_t> seen_ids,
               std::span<const std::pair<int32_t, int32_t>> counts) {
  apply_logit_bias(logits, n, params.logit_bias);
  apply_repetition_penalty(logits, n, seen_ids, params.repetition_penalty);
  apply_presence_frequency_penalty(logits, n, counts, params.presence_penalty, params.frequency_penalty);
  apply_temperature(logits, n, params.temperature);
  apply_top_k(logits, n, params.top_k);
  apply_top_p(logits, n, params.top_p);
  apply_min_p(logits, n, params.min_p);
}

}  // namespace strata
