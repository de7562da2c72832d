#include "engine/speculative.h"

#include <algorithm>
#include <cmath>
#include <queue>

namespace strata {

Result<SpecMethod> parse_spec_method(const std::string& s) {
  if (s == "off") return SpecMethod::kOff;
  if (s == "ngram") return SpecMethod::kNgram;
  if (s == "draft") return SpecMethod::kDraft;
  return make_error(ErrorCode::kInvalidArgument, "--speculative must be off, ngram or draft, got '" + s + "'");
}

void AcceptanceStats::observe(int32_t n_drafted, int32_t n_accepted) {
  accepted = accepted * kDecay + n_accepted;
  tried = tried * kDecay + n_accepted + (n_accepted < n_drafted ? 1 : 0);
}

void StepCostModel::observe(int32_t n_tokens, double seconds) {
  if (n_tokens <= 0 || !(seconds >= 0.0) || !std::isfinite(seconds)) return;
  const double n = n_tokens;
  w_ = w_ * kDecay + 1.0;
  sn_ = sn_ * kDecay + n;
  snn_ = snn_ * kDecay + n * n;
  sy_ = sy_ * kDecay + seconds;
  sny_ = sny_ * kDecay + n * seconds;
}

double StepCostModel::per_token_s() const {
  if (w_ <= 0.0) return 0.0;
  const double mn = sn_ / w_, my = sy_ / w_;
  const double var = snn_ / w_ - mn * mn, cov = sny_ / w_ - mn * my;
  // Ridge toward the prior slope with the weight of one token's variance: steps all of one size
  // say nothing of the slope.
  const double prior = my / (mn + 16.0);
  const double b = (cov + prior) / (std::max(var, 0.0) + 1.0);
  return std::clamp(b, 0.0, my / std::max(mn, 1.0));
}

double StepCostModel::fixed_s() const {
  if (w_ <= 0.0) return 0.0;
  return std::max(0.0, sy_ / w_ - per_token_s() * (sn_ / w_));
}

std::vector<int32_t> choose_draft_lengths(std::span<const double> rates, std::span<const int32_t> max_k,
                                          std::span<const uint8_t> probe, const StepCostModel& cost,
                                          double draft_s_per_token) {
  const size_t n = rates.size();
  std::vector<int32_t> k(n, 0);
  for (size_t i = 0; i < n; ++i) {
    if (probe[i] && max_k[i] > 0) k[i] = 1;
  }
  if (n == 0) return k;
  double a = cost.fixed_s(), b = cost.per_token_s();
  if (cost.empty()) {
    a = 1.0;  // no step measured yet: a unit step, 16 extra tokens doubling it
    b = a / 16.0;
  }
  const double step = b + std::max(draft_s_per_token, 0.0);
  double tokens = double(n), seconds = a + b * double(n);
  for (size_t i = 0; i < n; ++i) {
    tokens += k[i] > 0 ? rates[i] : 0.0;
    seconds += k[i] * step;
  }
  if (step <= 0.0) {  // free drafts: as many as allowed
    for (size_t i = 0; i < n; ++i) k[i] = std::max(k[i], max_k[i]);
    return k;
  }
  // (expected gain of the row's next draft, row), largest first.
  using Item = std::pair<double, size_t>;
  std::priority_queue<Item> heap;
  for (size_t i = 0; i < n; ++i) {
    if (k[i] < max_k[i]) heap.push({std::pow(rates[i], double(k[i] + 1)), i});
  }
  while (!heap.empty()) {
    const auto [gain, i] = heap.top();
    heap.pop();
    if (gain / step <= tokens / seconds) break;  // the best addition no longer pays: none does
    ++k[i];
    tokens += gain;
    seconds += step;
    if (k[i] < max_k[i]) heap.push({gain * rates[i], i});
  }
  return k;
}

}  // namespace strata
