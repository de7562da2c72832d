// SamplingParams: everything that decides which token follows the logits, as a request sets
// it. Part of the identity of a generation (prefix of a checkpoint key), so keep it plain data.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "core/status.h"

namespace strata {

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy (argmax, lowest id wins ties)
  int32_t top_k = 0;                // 0 or < 0: off
  float top_p = 1.0f;               // 1: off
  float min_p = 0.0f;               // 0: off
  float repetition_penalty = 1.0f;  // 1: off; divides positive / multiplies negative logits of seen ids
  float presence_penalty = 0.0f;    // subtracted once from logits of ids generated so far
  float frequency_penalty = 0.0f;   // subtracted per occurrence among generated ids
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to a token's logit
  uint64_t seed = 0;                // RNG seed; has_seed false: the engine draws one
  bool has_seed = false;
  // Ids >= vocab_limit are never sampled: the LM head of many checkpoints is padded past the
  // tokenizer's vocabulary (to a multiple of 64/128) and those rows are untrained. The engine
  // sets it to the tokenizer's vocabulary size; 0: every row of the logits is a real token.
  int32_t vocab_limit = 0;

  bool greedy() const { return temperature <= 0.0f; }
};

// Checks every field against the ranges strata (and the OpenAI API) accept. model_vocab is the
// width of the model's logits; logit_bias ids must lie below min(model_vocab, vocab_limit).
// The error message names the field and the value, e.g. "top_p must be in (0, 1], got 1.5".
Status validate_sampling_params(const SamplingParams& params, int32_t model_vocab);

}  // namespace strata
