#include "sampling/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>

#include "core/check.h"
#include "sampling/vector_math.h"

namespace strata {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();

// Top-k up to this k keeps a min-heap of the k largest (one compare per token once it fills);
// larger k counts the top 12 bits of an order-preserving key and runs nth_element on the
// one range that holds the k-th value. Both are O(V) and exact.
constexpr int32_t kHeapTopK = 256;

// Radix selection over float bits. For a weight w in [0, 1], weight_key(w) = bits(1) - bits(w)
// orders tokens heavier-first (smaller key = heavier; equal keys = equal weights), and its top
// bits group weights into ranges that are contiguous in the heavier() order. The nucleus is
// found by a mass histogram over the top 10 key bits, then only the boundary range is refined
// (next 10 bits, last 10 bits) and finally sorted: tokens above the boundary are kept without
// ever being sorted, so top-p costs O(V) even when the nucleus holds most of the vocabulary.
constexpr uint32_t kOneBits = 0x3F800000u;                 // bits of 1.0f
constexpr int32_t kLevel1Buckets = (kOneBits >> 20) + 1;   // key >> 20 for keys in [0, kOneBits]
constexpr int32_t kLevelBuckets = 1024;                    // 10-bit levels below the first
constexpr size_t kEdgeSortSize = 64;                       // boundary ranges this small are sorted

uint32_t weight_key(float w) { return kOneBits - std::bit_cast<uint32_t>(w); }  // w in [0, 1]

// heavier() as a lambda, so std::sort inlines it.
constexpr auto by_heavier = [](const WeightedToken& a, const WeightedToken& b) { return heavier(a, b); };

// Order-preserving key of any non-NaN float (ascending value -> ascending key).
uint32_t ordered_key(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The first bucket where the running mass (starting at *before) reaches target; *before
// becomes the mass of the buckets ahead of it. If rounding keeps the sum short of target,
// the last non-empty bucket (every token is kept).
int32_t crossing_bucket(const double* mass, int32_t n_buckets, double target, double* before) {
  int32_t last_nonempty = 0;
  double before_last = *before, cum = *before;
  for (int32_t b = 0; b < n_buckets; ++b) {
    if (mass[b] <= 0.0) continue;
    if (cum + mass[b] >= target) {
      *before = cum;
      return b;
    }
    before_last = cum;
    last_nonempty = b;
    cum += mass[b];
  }
  *before = before_last;
  return last_nonempty;
}

// A heavier()-order prefix of a row of weights: token i (weight w) is kept iff
// bits(w) > cut_bits, or bits(w) == cut_bits and i <= cut_id. For non-negative floats the bits
// order like the values, so this is "heavier than the cut token, or the cut token's weight
// and an id not past it". cut_bits = -1 keeps the whole row. Integer compares only, so the
// loops over a row vectorize.
float kept_weight(float w, int32_t i, int32_t cut_bits, int32_t cut_id) {
  const int32_t b = std::bit_cast<int32_t>(w);
  const int32_t heavier_than_cut = b > cut_bits;
  const int32_t tied_not_past = static_cast<int32_t>(b == cut_bits) & static_cast<int32_t>(i <= cut_id);
  const int32_t keep = heavier_than_cut | tied_not_past;
  return std::bit_cast<float>(b & -keep);
}

// Sum of the kept weights of w[begin, end), end - begin <= kBlock. The masked copy through a
// stack buffer is a loop the compiler vectorizes; masking inside the lane sums was not.
constexpr int32_t kBlock = 256;

double kept_block_sum(const float* w, int32_t begin, int32_t end, int32_t cut_bits, int32_t cut_id) {
  float buf[kBlock];
  const int32_t len = end - begin;
  for (int32_t j = 0; j < len; ++j) buf[j] = kept_weight(w[begin + j], begin + j, cut_bits, cut_id);
  return sum_weights(buf, len);
}

double kept_sum(const float* w, int32_t n, int32_t cut_bits, int32_t cut_id) {
  double total = 0.0;
  for (int32_t b = 0; b < n; b += kBlock) total += kept_block_sum(w, b, std::min(b + kBlock, n), cut_bits, cut_id);
  return total;
}

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

int32_t Sampler::prepare(const float* logits, int32_t n, const TokenMask* mask) {
  if (work_.size() < static_cast<size_t>(n)) work_.resize(n);
  float* w = work_.data();
  for (int32_t i = 0; i < n; ++i) w[i] = nan_to_neg_inf(logits[i]);
  apply_logit_bias(w, n, params_.logit_bias);
  apply_repetition_penalty(w, n, seen_, params_.repetition_penalty);
  apply_presence_frequency_penalty(w, n, counts_, params_.presence_penalty, params_.frequency_penalty);
  if (mask != nullptr) {
    const int32_t covered = std::min(n, std::max(mask->n_ids, 0));
    for (int32_t i = 0; i < covered; ++i) {
      if (!((mask->words[i >> 5] >> (i & 31)) & 1u)) w[i] = kNegInf;
    }
    for (int32_t i = covered; i < n; ++i) w[i] = kNegInf;
  }
  const float m = max_value(w, n);
  STRATA_CHECK(m > kNegInf, "every logit of the row is -inf or NaN");
  int32_t best = 0;
  while (w[best] != m) ++best;  // the lowest id holding the maximum
  return best;
}

float Sampler::kth_largest(const float* t, int32_t n, int32_t k) {
  if (k <= kHeapTopK) {
    // A min-heap of the k largest so far: after the first few thousand tokens almost every
    // token fails the one compare against its root.
    heap_.assign(t, t + k);
    std::make_heap(heap_.begin(), heap_.end(), std::greater<float>());
    for (int32_t i = k; i < n; ++i) {
      if (t[i] > heap_.front()) {
        std::pop_heap(heap_.begin(), heap_.end(), std::greater<float>());
        heap_.back() = t[i];
        std::push_heap(heap_.begin(), heap_.end(), std::greater<float>());
      }
    }
    return heap_.front();
  }
  // Counts over the top 12 bits of the order-preserving key find the range holding the k-th
  // largest value; nth_element then runs on that range only.
  uint32_t counts[4096] = {};
  for (int32_t i = 0; i < n; ++i) ++counts[ordered_key(t[i]) >> 20];
  int32_t above = 0;
  uint32_t b = 4095;
  while (above + static_cast<int32_t>(counts[b]) < k) above += counts[b--];
  heap_.clear();
  for (int32_t i = 0; i < n; ++i) {
    if ((ordered_key(t[i]) >> 20) == b) heap_.push_back(t[i]);
  }
  const int32_t rank = k - above - 1;
  std::nth_element(heap_.begin(), heap_.begin() + rank, heap_.end(), std::greater<float>());
  return heap_[rank];
}

void Sampler::select_nucleus(int32_t n, float m) {
  float* w = work_.data();
  exp_shifted(w, n, m);
  const double total = sum_weights(w, n);
  // Four interleaved histograms: consecutive tokens often share a bucket, and one array would
  // chain every add through the previous store to the same slot.
  double hist[4][kLevel1Buckets] = {};
  int32_t i4 = 0;
  for (; i4 + 4 <= n; i4 += 4) {
    for (int k = 0; k < 4; ++k) hist[k][weight_key(w[i4 + k]) >> 20] += w[i4 + k];
  }
  for (; i4 < n; ++i4) hist[0][weight_key(w[i4]) >> 20] += w[i4];
  double level1[kLevel1Buckets];
  for (int32_t b = 0; b < kLevel1Buckets; ++b) level1[b] = (hist[0][b] + hist[1][b]) + (hist[2][b] + hist[3][b]);
  const double target = static_cast<double>(params_.top_p) * total;
  double before = 0.0;
  const uint32_t b1 = static_cast<uint32_t>(crossing_bucket(level1, kLevel1Buckets, target, &before));

  // Gather the boundary range. When it is a large share of the row, writes are unconditional
  // and the index advances on a match, so no branch depends on the data (edge_ keeps one slot
  // of slack for the last write); when it is small, a branch that is rarely taken is cheaper.
  size_t count = 0;
  for (int32_t i = 0; i < n; ++i) count += (weight_key(w[i]) >> 20) == b1;
  if (edge_.size() < count + 1) edge_.resize(count + 1);
  size_t j = 0;
  if (count * 64 < static_cast<size_t>(n)) {
    for (int32_t i = 0; i < n; ++i) {
      if ((weight_key(w[i]) >> 20) == b1) edge_[j++] = {w[i], i};
    }
  } else {
    for (int32_t i = 0; i < n; ++i) {
      edge_[j] = {w[i], i};
      j += (weight_key(w[i]) >> 20) == b1;
    }
  }
  // Refine it on the next 10 key bits, then the last 10: ranges ahead of the crossing are
  // inside the cut and need no further look; ranges behind it are out.
  bool one_weight = false;  // after the last level the range holds a single weight, in id order
  for (int shift : {10, 0}) {
    if (j <= kEdgeSortSize) break;
    one_weight = shift == 0;
    double hist_l[4][kLevelBuckets] = {};  // interleaved, as for level 1
    for (size_t e = 0; e < j; ++e) hist_l[e & 3][(weight_key(edge_[e].weight) >> shift) & 1023u] += edge_[e].weight;
    double level[kLevelBuckets];
    for (int32_t b = 0; b < kLevelBuckets; ++b) {
      level[b] = (hist_l[0][b] + hist_l[1][b]) + (hist_l[2][b] + hist_l[3][b]);
    }
    const uint32_t bl = static_cast<uint32_t>(crossing_bucket(level, kLevelBuckets, target, &before));
    size_t kept = 0;
    for (size_t e = 0; e < j; ++e) {
      const WeightedToken t = edge_[e];
      edge_[kept] = t;  // compaction keeps id order
      kept += ((weight_key(t.weight) >> shift) & 1023u) == bl;
    }
    j = kept;
  }
  if (!one_weight) std::sort(edge_.begin(), edge_.begin() + static_cast<std::ptrdiff_t>(j), by_heavier);
  // The cut token: the first whose running mass reaches target (the last one if rounding
  // keeps the sum short).
  WeightedToken cut = edge_[j - 1];
  double cum = before;
  for (size_t e = 0; e < j; ++e) {
    cum += edge_[e].weight;
    if (cum >= target) {
      cut = edge_[e];
      break;
    }
  }
  cut_bits_ = std::bit_cast<int32_t>(cut.weight);
  cut_id_ = cut.id;
  // min-p after top-p (HF order) keeps w >= min_p, itself a heavier()-order prefix: keep the
  // shorter of the two.
  if (params_.min_p > 0.0f) {
    const int32_t min_bits = std::bit_cast<int32_t>(params_.min_p);  // w >= min_p <=> bits(w) >= this
    if (min_bits > cut_bits_) {
      cut_bits_ = min_bits;
      cut_id_ = std::numeric_limits<int32_t>::max();
    }
  }
  mass_ = kept_sum(w, n, cut_bits_, cut_id_);
}

void Sampler::select(int32_t n, int32_t argmax) {
  float* w = work_.data();
  const float temperature = params_.temperature;
  cand_.clear();
  n_kept_ = 0;
  mass_ = 0.0;
  row_mode_ = true;
  cut_bits_ = -1;  // the whole row
  cut_id_ = 0;

  const float raw_max = w[argmax];
  if (std::isinf(raw_max / temperature)) {
    // A +inf logit, or a temperature so small that the maximum overflows: the limit of the
    // softmax puts all the mass, in equal parts, on the tokens tied at the maximum (filters
    // cannot change that). Dividing would give inf - inf = NaN instead.
    for (int32_t i = 0; i < n; ++i) {
      w[i] = w[i] == raw_max ? 1.0f : 0.0f;
      mass_ += w[i];
    }
    return;
  }
  for (int32_t i = 0; i < n; ++i) w[i] /= temperature;
  // Division by a positive number is monotone after rounding, so the argmax is unchanged.
  const float m = w[argmax];

  const bool top_k = params_.top_k > 0 && params_.top_k < n;
  const bool top_p = params_.top_p < 1.0f;
  const bool min_p = params_.min_p > 0.0f;
  if (!top_k && !top_p && !min_p) {
    exp_shifted(w, n, m);
    mass_ = sum_weights(w, n);
    return;
  }
  if (!top_k && top_p) {
    select_nucleus(n, m);
    return;
  }
  row_mode_ = false;
  float gate = top_k ? kth_largest(w, n, params_.top_k) : kNegInf;
  if (min_p && !top_p) {
    // Only a bound (the exact test is on the weight below); the slack covers the rounding of
    // s = t - m at large |m|.
    const float slack = 0.01f + std::fabs(m) * 1e-6f;
    gate = std::max(gate, m + std::log(params_.min_p) - slack);
  }
  // The mass of the top-k set (the distribution top-p sees), lane by id as sum_weights adds
  // it, so it equals the reference's sum over the whole row bit for bit.
  LaneSum top_k_mass;
  for (int32_t i = 0; i < n; ++i) {
    if (w[i] >= gate) {
      const float weight = exp_nonpositive(w[i] - m);
      cand_.push_back({weight, i});
      top_k_mass.add(i, weight);
    }
  }
  const double top_p_total = top_k_mass.total();

  std::sort(cand_.begin(), cand_.end(), by_heavier);
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
  if (row_mode_) {
    // Skip whole blocks by their (vectorized) kept sums, then walk the block that crosses
    // target. If rounding keeps the walk short of target, it carries on into the next block.
    const float* w = work_.data();
    for (int32_t b = 0; b < n; b += kBlock) {
      const int32_t end = std::min(b + kBlock, n);
      const double block = kept_block_sum(w, b, end, cut_bits_, cut_id_);
      if (acc + block <= target) {
        acc += block;
        continue;
      }
      for (int32_t i = b; i < end; ++i) {
        const float kw = kept_weight(w[i], i, cut_bits_, cut_id_);
        if (kw <= 0.0f) continue;
        acc += kw;
        last_positive = i;
        if (acc > target) return i;
      }
    }
    // Only rounding (target within an ulp of the total) reaches here.
    for (int32_t i = n - 1; i >= 0 && last_positive < 0; --i) {
      if (kept_weight(w[i], i, cut_bits_, cut_id_) > 0.0f) last_positive = i;
    }
  } else {
    for (int32_t j = 0; j < n_kept_; ++j) {
      if (cand_[j].weight <= 0.0f) continue;
      acc += cand_[j].weight;
      last_positive = cand_[j].id;
      if (acc > target) return cand_[j].id;
    }
  }
  STRATA_CHECK(last_positive >= 0, "no token with positive weight");
  return last_positive;
}

int32_t Sampler::sample(const float* logits, int32_t vocab, const TokenMask* mask) {
  STRATA_CHECK(vocab > 0, "vocab " + std::to_string(vocab));
  const int32_t n = effective_vocab(vocab);
  const int32_t argmax = prepare(logits, n, mask);
  if (params_.greedy()) return argmax;
  select(n, argmax);
  return draw(n);
}

void Sampler::distribution(const float* logits, int32_t vocab, float* probs, const TokenMask* mask) {
  STRATA_CHECK(vocab > 0, "vocab " + std::to_string(vocab));
  const int32_t n = effective_vocab(vocab);
  std::fill(probs, probs + vocab, 0.0f);
  const int32_t argmax = prepare(logits, n, mask);
  if (params_.greedy()) {
    probs[argmax] = 1.0f;
    return;
  }
  select(n, argmax);
  if (row_mode_) {
    for (int32_t i = 0; i < n; ++i) {
      probs[i] = static_cast<float>(kept_weight(work_[i], i, cut_bits_, cut_id_) / mass_);
    }
  } else {
    for (int32_t j = 0; j < n_kept_; ++j) probs[cand_[j].id] = static_cast<float>(cand_[j].weight / mass_);
  }
}

Status Sampler::logprobs(const float* logits, int32_t vocab, int32_t token, int32_t top_n, TokenLogprobs* out) const {
  return compute_logprobs(logits, effective_vocab(vocab), token, top_n, out);
}

}  // namespace strata
