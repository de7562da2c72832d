#include "sampling/logprobs.h"

#include "sampling/vector_math.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace strata {
namespace {

float clean(float v) { return nan_to_neg_inf(v); }

bool before(const TokenLogprob& a, const TokenLogprob& b) {
  return a.logprob > b.logprob || (a.logprob == b.logprob && a.token < b.token);
}

}  // namespace

Status compute_logprobs(const float* logits, int32_t n, int32_t token, int32_t top_n, TokenLogprobs* out) {
  if (top_n < 0 || top_n > kMaxTopLogprobs) {
    return make_error(ErrorCode::kInvalidArgument, "top_logprobs must be in [0, " + std::to_string(kMaxTopLogprobs) +
                                                       "], got " + std::to_string(top_n));
  }
  if (token < 0 || token >= n) {
    return make_error(ErrorCode::kOutOfRange,
                      "token " + std::to_string(token) + " is outside the vocabulary [0, " + std::to_string(n) + ")");
  }
  const float m = max_value(logits, n);  // NaN never wins a comparison
  const double log_total = std::log(sum_exp_shifted(logits, n, m));

  // The selection keeps raw logits in .logprob (same order) and converts at the end; ids are
  // visited ascending, so a later id never displaces an equal logit.
  out->top.reserve(kMaxTopLogprobs);
  out->top.clear();
  for (int32_t i = 0; i < n && top_n > 0; ++i) {
    const float l = clean(logits[i]);
    if (static_cast<int32_t>(out->top.size()) == top_n) {
      if (!(l > out->top.back().logprob)) continue;
      out->top.pop_back();
    }
    size_t pos = out->top.size();
    out->top.push_back({i, l});
    while (pos > 0 && l > out->top[pos - 1].logprob) {
      out->top[pos] = out->top[pos - 1];
      --pos;
    }
    out->top[pos] = {i, l};
  }
  auto to_logprob = [&](float l) { return static_cast<float>((static_cast<double>(l) - m) - log_total); };
  for (auto& t : out->top) t.logprob = to_logprob(t.logprob);
  // Two logits that differ by less than the rounding of the conversion can meet at one
  // logprob: restore the (logprob, id) order.
  for (size_t j = 1; j < out->top.size(); ++j) {
    for (size_t k = j; k > 0 && before(out->top[k], out->top[k - 1]); --k) std::swap(out->top[k], out->top[k - 1]);
  }
  out->chosen = {token, to_logprob(clean(logits[token]))};
  return Status::ok_status();
}

}  // namespace strata
