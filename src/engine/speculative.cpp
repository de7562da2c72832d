#include "engine/speculative.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <queue>

namespace strata {

Result<SpecMethod> parse_spec_method(const std::string& s) {
  if (s == "off") return SpecMethod::kOff;
  if (s == "ngram") return SpecMethod::kNgram;
  if (s == "draft") return SpecMethod::kDraft;
  return make_error(ErrorCode::kInvalidArgument, "--speculative must be off, ngram or draft, got '" + s + "'");
}

void AcceptanceStats::observe(int32_t n_drafted, int32_t n_accepted) {
  accepted = accepted * decay + n_accepted;
  tried = tried * decay + n_accepted + (n_accepted < n_drafted ? 1 : 0);
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

namespace {

// The a and b of a model, borrowed from the other when it has seen no step yet (a unit step
// with 16 extra tokens doubling it when neither has).
std::pair<double, double> coefficients(const StepCostModel& m, const StepCostModel& other) {
  const StepCostModel& use = m.empty() ? other : m;
  if (use.empty()) return {1.0, 1.0 / 16.0};
  return {use.fixed_s(), use.per_token_s()};
}

double expected_tokens(double rate, int32_t k) {
  double e = 0.0, p = 1.0;
  for (int32_t j = 0; j <= k; ++j, p *= rate) e += p;
  return e;
}

}  // namespace

double modelled_step_rate(std::span<const double> rates, std::span<const int32_t> k, const StepCosts& costs) {
  double tokens = 0.0;
  int64_t n = 0;
  int32_t depth = 0;
  for (size_t i = 0; i < rates.size(); ++i) {
    tokens += expected_tokens(rates[i], k[i]);
    n += 1 + k[i];
    depth = std::max(depth, k[i]);
  }
  double seconds;
  if (depth == 0) {
    const auto [a, b] = coefficients(costs.plain, costs.verify);
    seconds = a + b * double(n);
  } else {
    const auto [a, b] = coefficients(costs.verify, costs.plain);
    seconds = a + b * double(n) + double(depth) * costs.draft_position.value();
  }
  return seconds > 0.0 ? tokens / seconds : std::numeric_limits<double>::infinity();
}

std::vector<int32_t> choose_draft_lengths(std::span<const double> rates, std::span<const int32_t> max_k,
                                          std::span<const uint8_t> probe, const StepCosts& costs) {
  const size_t n = rates.size();
  std::vector<int32_t> base(n, 0);
  int32_t deepest = 0;
  for (size_t i = 0; i < n; ++i) {
    base[i] = std::min<int32_t>(probe[i], max_k[i]);
    deepest = std::max(deepest, max_k[i]);
  }
  std::vector<int32_t> best = base;
  if (n == 0) return best;
  double best_rate = modelled_step_rate(rates, best, costs);
  const auto [a, b] = coefficients(costs.verify, costs.plain);
  const double c = costs.draft_position.value();
  using Item = std::pair<double, size_t>;  // (expected gain of the row's next draft, row)
  std::vector<int32_t> k;
  for (int32_t depth = 1; depth <= deepest; ++depth) {
    k = base;
    double tokens = 0.0, n_tokens = 0.0;
    std::priority_queue<Item> heap;
    for (size_t i = 0; i < n; ++i) {
      tokens += expected_tokens(rates[i], k[i]);
      n_tokens += 1 + k[i];
      if (k[i] < std::min(depth, max_k[i])) heap.push({std::pow(rates[i], double(k[i] + 1)), i});
    }
    double seconds = a + b * n_tokens + double(depth) * c;
    // Largest gains first while one pays more than the step's rate so far: for a given number
    // of drafts the largest gains are best, and past the first that does not pay none does. The
    // first is taken whatever it gains: without drafts a step is plain, priced by plain(n),
    // which best_rate already holds.
    bool first = true;
    while (!heap.empty()) {
      const auto [gain, i] = heap.top();
      heap.pop();
      if (!first && b > 0.0 && gain / b <= tokens / seconds) break;
      first = false;
      ++k[i];
      tokens += gain;
      seconds += b;
      if (k[i] < std::min(depth, max_k[i])) heap.push({gain * rates[i], i});
    }
    const double rate = modelled_step_rate(rates, k, costs);
    if (rate > best_rate) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

}  // namespace strata
