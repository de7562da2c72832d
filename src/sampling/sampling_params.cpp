#include "sampling/sampling_params.h"

#include <charconv>
#include <cmath>
#include <string>

namespace strata {
namespace {

// Shortest text that reads back as the same float ("0.1", not "0.100000001"); "nan", "inf".
std::string float_text(float v) {
  char buf[32];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  return ec == std::errc() ? std::string(buf, end) : std::string("?");
}

Error invalid(const std::string& field, const std::string& rule, const std::string& value) {
  return make_error(ErrorCode::kInvalidArgument, field + " must be " + rule + ", got " + value);
}

// Comparisons are written so that NaN fails them: !(lo <= v && v <= hi).
bool in_closed(float v, float lo, float hi) { return v >= lo && v <= hi; }

}  // namespace

Status validate_sampling_params(const SamplingParams& p, int32_t model_vocab) {
  if (!(p.temperature >= 0.0f) || std::isinf(p.temperature)) {
    return invalid("temperature", "a finite number >= 0", float_text(p.temperature));
  }
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return invalid("top_p", "in (0, 1]", float_text(p.top_p));
  if (p.top_k < -1) return invalid("top_k", ">= -1 (0 or -1: off)", std::to_string(p.top_k));
  if (!in_closed(p.min_p, 0.0f, 1.0f)) return invalid("min_p", "in [0, 1]", float_text(p.min_p));
  if (!(p.repetition_penalty > 0.0f) || std::isinf(p.repetition_penalty)) {
    return invalid("repetition_penalty", "a finite number > 0", float_text(p.repetition_penalty));
  }
  if (!in_closed(p.presence_penalty, -2.0f, 2.0f)) {
    return invalid("presence_penalty", "in [-2, 2]", float_text(p.presence_penalty));
  }
  if (!in_closed(p.frequency_penalty, -2.0f, 2.0f)) {
    return invalid("frequency_penalty", "in [-2, 2]", float_text(p.frequency_penalty));
  }
  if (p.vocab_limit < 0 || p.vocab_limit > model_vocab) {
    return invalid("vocab_limit", "in [0, " + std::to_string(model_vocab) + "] (0: off)",
                   std::to_string(p.vocab_limit));
  }
  const int32_t vocab = p.vocab_limit > 0 ? p.vocab_limit : model_vocab;
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab) {
      return invalid("logit_bias token id", "in [0, " + std::to_string(vocab) + ")", std::to_string(id));
    }
    if (!in_closed(bias, -100.0f, 100.0f)) {
      return invalid("logit_bias[" + std::to_string(id) + "]", "in [-100, 100]", float_text(bias));
    }
  }
  return Status::ok_status();
}

}  // namespace strata
