// Logits processors: the plain reference version of every step that turns model logits into
// the distribution a token is drawn from. Each works in place on logits[0, n) and marks a
// removed token with -inf. They are the oracle for the fused path in Sampler (sampler.cpp)
// and are tested one by one; the fused path must produce the same kept set and probabilities.
//
// The fixed order (Sampler follows it; apply_all() below spells it out):
//   1. vocab limit       ids >= vocab_limit (padded LM-head rows) are never candidates;
//                        callers simply pass n = min(vocab, vocab_limit).
//   2. logit bias        logit += bias (OpenAI logit_bias; vLLM also applies it before penalties).
//   3. repetition        HF RepetitionPenaltyLogitsProcessor: for every distinct id of prompt
//                        + generated tokens, a positive logit is divided by the penalty, a
//                        negative one multiplied; once per id, however often it occurred.
//   4. presence/frequency  OpenAI: logit -= frequency * count + presence * (count > 0), count
//                        over generated tokens only. vLLM applies 3 then 4 as here.
//   5. temperature       logit / T (T = 0 is greedy: argmax of the result of 1-4, lowest id on
//                        ties; 5-8 do not change the argmax and are skipped).
//   6. top-k             HF TopKLogitsWarper: keep every token whose logit is >= the k-th
//                        largest, so ties at the boundary are all kept.
//   7. top-p             HF TopPLogitsWarper on the distribution left by 6: order by probability
//                        descending (then id ascending), keep the shortest prefix whose mass is
//                        >= top_p (at least one token).
//   8. min-p             HF MinPLogitsWarper: keep p >= min_p * p_max. The ratio to the maximum
//                        does not change when 6-7 renormalize, so 8 after 7 is the HF order.
// The warper order 5-8 is Hugging Face's (temperature, top-k, top-p, min-p); vLLM applies
// min-p before top-k/top-p, which gives a different top-p set when both are on.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "sampling/sampling_params.h"

namespace strata {

// 2. Ids outside [0, n) are ignored (validation rejects them earlier).
void apply_logit_bias(float* logits, int32_t n, std::span<const std::pair<int32_t, float>> bias);

// 3. seen_ids: distinct ids of prompt and generated tokens; ids outside [0, n) are ignored.
void apply_repetition_penalty(float* logits, int32_t n, std::span<const int32_t> seen_ids, float penalty);

// 4. counts: (id, occurrences among generated tokens), one entry per distinct id.
void apply_presence_frequency_penalty(float* logits, int32_t n,
                                      std::span<const std::pair<int32_t, int32_t>> counts,
                                      float presence, float frequency);

// 5. temperature > 0.
void apply_temperature(float* logits, int32_t n, float temperature);

// 6. k <= 0 or k >= n: no-op.
void apply_top_k(float* logits, int32_t n, int32_t k);

// 7. p >= 1: no-op.
void apply_top_p(float* logits, int32_t n, float p);

// 8. min_p <= 0: no-op.
void apply_min_p(float* logits, int32_t n, float min_p);

// probs[i] = exp(logits[i] - max) / sum; -inf gives 0. Weights come from exp_nonpositive and
// are summed by sum_weights (vector_math.h), the same arithmetic as the fused path.
void softmax(const float* logits, int32_t n, float* probs);

// Whole pipeline 2-8 for a non-greedy request, in place (the reference for Sampler::distribution):
// seen_ids and counts as for 3 and 4.
void apply_all(float* logits, int32_t n, const SamplingParams& params, std::span<const int32_t> seen_ids,
               std::span<const std::pair<int32_t, int32_t>> counts);

// The probability-order used by top-p and by the sampler's candidate list: weight descending,
// then id ascending, so the order (and hence the kept set) is total and deterministic.
struct WeightedToken {
  float weight;  // exp(logit - max logit), in (0, 1]
  int32_t id;
};
inline bool heavier(const WeightedToken& a, const WeightedToken& b) {
  return a.weight > b.weight || (a.weight == b.weight && a.id < b.id);
}

// Penalty helpers shared with the fused path, so both round identically.
inline float repetition_penalized(float logit, float penalty) {
  return logit > 0.0f ? logit / penalty : logit * penalty;
}

}  // namespace strata
