// Logprobs as the OpenAI API reports them: log_softmax of the raw model logits (before logit
// bias, penalties, temperature and the top-k/p/min-p filters), which is also vLLM's default
// ("raw" logprobs). The distribution covers only the real vocabulary [0, n): callers pass n
// already clipped to the vocab limit, as Sampler::logprobs does.
#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"

namespace strata {

inline constexpr int32_t kMaxTopLogprobs = 20;  // OpenAI's upper bound for top_logprobs

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;  // natural log; -inf for a token the model gave a -inf/NaN logit
};

struct TokenLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // up to top_n entries, logprob descending, then id ascending
};

// One O(n) pass for the maximum, one for the log-sum-exp and the top_n selection. NaN logits
// count as -inf. Errors: top_n outside [0, kMaxTopLogprobs] (field "top_logprobs") or a token
// outside [0, n). Allocates only if out->top has never held kMaxTopLogprobs entries.
Status compute_logprobs(const float* logits, int32_t n, int32_t token, int32_t top_n, TokenLogprobs* out);

}  // namespace strata
