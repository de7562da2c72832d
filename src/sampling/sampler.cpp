#include "sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/check.h"

namespace strata {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// Top-k by a bounded min-heap when k is small (one compare per token, few inserts); larger k
// falls back to nth_element over a copy. Both yield the exact k-th largest value.
constexpr int32_t kHeapTopK = 512;

// Top-p without top-k: weights are bucketed by how many nats they lie below the maximum, so
// the bucket where the cumulative mass crosses top_p bounds the nucleus; only tokens down to
// that bucket are sorted. Tokens more than kBucketNats below the maximum share the last bucket.
constexpr int32_t kBucketsPerNat = 4;
constexpr int32_t kBucketNats = 40;
constexpr int32_t kBuckets = kBucketsPerNat * kBucketNats + 1;

}  // namespace

Result<Sampler> Sampler::create(const SamplingParams& params, int32_t model_vocab, std::span<const int32_t> prompt) {
  STRATA_RETURN_IF_ERROR(validate_sampling_params(params, model_vocab));
  Sampler s(params);
  if (params.repetition_penalty != 1.0f) {
    for (int32_t id : prompt) s.add_seen(id);
  }
  return s;
}

int32_t Sampler::effective_vocab(int32_t vocab) const {
  return params_.vocab_limit > 0 ? std::min(vocab, params_.vocab_limit) : vocab;
}

void Sampler::add_seen(int32_t token) {
  if (seen_index_.insert(token).second) seen_.push_back(token);
}

void Sampler::accept(int32_t token) {
  STRATA_CHECK(token >= 0, "accepted token id " + std::to_string(token));
  ++n_accepted_;
  if (params_.repetition_penalty != 1.0f) add_seen(token);
  auto [it, inserted] = count_index_.emplace(token, counts_.size());
  if (inserted) {
    counts_.emplace_back(token, 1);
  } else {
    ++counts_[it->second].second;
  }
}

int32_t Sampler::prepare(const float* logits, int32_t n) {
  if (work_.size() < static_cast<size_t>(n)) work_.resize(n);
  float* w = work_.data();
  for (int32_t i = 0; i < n; ++i) w[i] = std::isnan(logits[i]) ? kNegInf : logits[i];
  apply_logit_bias(w, n, params_.logit_bias);
  apply_repetition_penalty(w, n, seen_, params_.repetition_penalty);
  apply_presence_frequency_penalty(w, n, counts_, params_.presence_penalty, params_.frequency_penalty);
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i) {
    if (w[i] > w[best]) best = i;
  }
  STRATA_CHECK(w[best] > kNegInf, "every logit of the row is -inf or NaN");
  return best;
}

void Sampler::select(int32_t n, int32_t argmax) {
  float* w = work_.data();
  const float temperature = params_.temperature;
  for (int32_t i = 0; i < n; ++i) w[i] /= temperature;
  // Division by a positive number is monotone after rounding, so the argmax is unchanged.
  const float m = w[argmax];
  cand_.clear();
  n_kept_ = 0;
  mass_ = 0.0;

  if (m == kPosInf) {
    // Degenerate row: the +inf logits share all the mass; filters cannot change that.
    direct_ = true;
    for (int32_t i = 0; i < n; ++i) {
      w[i] = w[i] == kPosInf ? 1.0f : 0.0f;
      mass_ += w[i];
    }
    return;
  }

  const bool top_k = params_.top_k > 0 && params_.top_k < n;
  const bool top_p = params_.top_p < 1.0f;
  const bool min_p = params_.min_p > 0.0f;
  direct_ = !top_k && !top_p && !min_p;
  if (direct_) {
    for (int32_t i = 0; i < n; ++i) {
      w[i] = std::exp(w[i] - m);
      mass_ += w[i];
    }
    return;
  }

  double top_p_total = 0.0;  // mass of the distribution top-p sees (after top-k)
  if (!top_k && top_p) {
    double bucket_mass[kBuckets] = {};
    for (int32_t i = 0; i < n; ++i) {
      const float s = w[i] - m;  // <= 0
      const float weight = std::exp(s);
      w[i] = weight;
      top_p_total += weight;
      const float depth = -s * kBucketsPerNat;
      const int32_t b = depth < static_cast<float>(kBuckets - 1) ? static_cast<int32_t>(depth) : kBuckets - 1;
      bucket_mass[b] += weight;
    }
    // Buckets hold disjoint ranges of weight, heavier first; once the heavier buckets reach
    // top_p of the mass, everything below them lies past the nucleus.
    const double target = static_cast<double>(params_.top_p) * top_p_total;
    int32_t last = kBuckets - 1;
    double cum = 0.0;
    for (int32_t b = 0; b < kBuckets; ++b) {
      cum += bucket_mass[b];
      if (cum >= target) {
        last = b;
        break;
      }
    }
    // 0.01 nats of slack absorbs the rounding of exp() at the bucket edge; extra candidates
    // are only sorted, never kept wrongly.
    float gate = last == kBuckets - 1
                     ? 0.0f
                     : std::exp(-static_cast<float>(last + 1) / kBucketsPerNat - 0.01f);
    if (min_p) gate = std::max(gate, params_.min_p);
    for (int32_t i = 0; i < n; ++i) {
      if (w[i] >= gate && w[i] > 0.0f) cand_.push_back({w[i], i});
    }
  } else {
    float gate = kNegInf;
    if (top_k) {
      const int32_t k = params_.top_k;
      if (k <= kHeapTopK) {
        heap_.assign(w, w + k);
        std::make_heap(heap_.begin(), heap_.end(), std::greater<float>());
        for (int32_t i = k; i < n; ++i) {
          if (w[i] > heap_.front()) {
            std::pop_heap(heap_.begin(), heap_.end(), std::greater<float>());
            heap_.back() = w[i];
            std::push_heap(heap_.begin(), heap_.end(), std::greater<float>());
          }
        }
        gate = heap_.front();
      } else {
        heap_.assign(w, w + n);
        std::nth_element(heap_.begin(), heap_.begin() + (k - 1), heap_.end(), std::greater<float>());
        gate = heap_[k - 1];
      }
    }
    if (min_p && !top_p) {
      // Only a bound here (the exact test is on the weight below); the slack covers the
      // rounding of s = t - m at large |m|.
      const float slack = 0.01f + std::fabs(m) * 1e-6f;
      gate = std::max(gate, m + std::log(params_.min_p) - slack);
    }
    for (int32_t i = 0; i < n; ++i) {
      if (w[i] >= gate) {
        const float weight = std::exp(w[i] - m);
        cand_.push_back({weight, i});
        top_p_total += weight;  // id order, as the reference sums it
      }
    }
  }

  std::sort(cand_.begin(), cand_.end(), heavier);
  int32_t keep = static_cast<int32_t>(cand_.size());
  if (top_p) {
    const double target = static_cast<double>(params_.top_p) * top_p_total;
    double cum = 0.0;
    for (int32_t j = 0; j < keep; ++j) {
      cum += cand_[j].weight;
      if (cum >= target) {
        keep = j + 1;
        break;
      }
    }
  }
  if (min_p) {
    int32_t j = 0;
    while (j < keep && cand_[j].weight >= params_.min_p) ++j;
    keep = std::max(j, 1);  // the maximum has weight 1 >= min_p; max() only guards rounding
  }
  n_kept_ = keep;
  for (int32_t j = 0; j < keep; ++j) mass_ += cand_[j].weight;
}

int32_t Sampler::draw(int32_t n) {
  const double target = rng_.next_double() * mass_;
  double acc = 0.0;
  int32_t last_positive = -1;
  if (direct_) {
    const float* w = work_.data();
    for (int32_t i = 0; i < n; ++i) {
      if (w[i] <= 0.0f) continue;
      acc += w[i];
      last_positive = i;
      if (acc > target) return i;
    }
  } else {
    for (int32_t j = 0; j < n_kept_; ++j) {
      if (cand_[j].weight <= 0.0f) continue;
      acc += cand_[j].weight;
      last_positive = cand_[j].id;
      if (acc > target) return cand_[j].id;
    }
  }
  // Only rounding (target within an ulp of the total) reaches here.
  STRATA_CHECK(last_positive >= 0, "no token with positive weight");
  return last_positive;
}

int32_t Sampler::sample(const float* logits, int32_t vocab) {
  STRATA_CHECK(vocab > 0, "vocab " + std::to_string(vocab));
  const int32_t n = effective_vocab(vocab);
  const int32_t argmax = prepare(logits, n);
  if (params_.greedy()) return argmax;
  select(n, argmax);
  return draw(n);
}

void Sampler::distribution(const float* logits, int32_t vocab, float* probs) {
  STRATA_CHECK(vocab > 0, "vocab " + std::to_string(vocab));
  const int32_t n = effective_vocab(vocab);
  std::fill(probs, probs + vocab, 0.0f);
  const int32_t argmax = prepare(logits, n);
  if (params_.greedy()) {
    probs[argmax] = 1.0f;
    return;
  }
  select(n, argmax);
  if (direct_) {
    for (int32_t i = 0; i < n; ++i) probs[i] = static_cast<float>(work_[i] / mass_);
  } else {
    for (int32_t j = 0; j < n_kept_; ++j) probs[cand_[j].id] = static_cast<float>(cand_[j].weight / mass_);
  }
}

Status Sampler::logprobs(const float* logits, int32_t vocab, int32_t token, int32_t top_n, TokenLogprobs* out) const {
  return compute_logprobs(logits, effective_vocab(vocab), token, top_n, out);
}

}  // namespace strata
