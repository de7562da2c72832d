// SamplingParams: everything that decides which token follows the logits, as a request sets
// it. Part of the identity of a generation (prefix of a checkpoint key), so keep it plain data.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

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

  bool greedy() const { return temperature <= 0.0f; }
};

}  // namespace strata
