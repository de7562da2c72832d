#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "sampling/sampling_params.h"

namespace strata {
namespace {

// Expects validation to fail and the message to name both the field and the offending value.
void expect_rejected(const SamplingParams& p, const std::string& field, const std::string& value,
                     int32_t vocab = 1000) {
  Status st = validate_sampling_params(p, vocab);
  ASSERT_FALSE(st.ok()) << field << "=" << value << " was accepted";
  EXPECT_EQ(st.error().code, ErrorCode::kInvalidArgument);
  EXPECT_NE(st.error().message.find(field), std::string::npos) << st.error().message;
  EXPECT_NE(st.error().message.find(value), std::string::npos) << st.error().message;
}

TEST(SamplingParamsValidation, DefaultsAndEdgesAreAccepted) {
  SamplingParams p;
  EXPECT_TRUE(validate_sampling_params(p, 1000).ok());
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.top_k = -1;
  p.min_p = 1.0f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.repetition_penalty = 0.01f;
  p.logit_bias = {{0, -100.0f}, {999, 100.0f}};
  EXPECT_TRUE(validate_sampling_params(p, 1000).ok());
  p.vocab_limit = 1000;
  EXPECT_TRUE(validate_sampling_params(p, 1000).ok());
}

TEST(SamplingParamsValidation, EachFieldNamesItselfAndTheValue) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  SamplingParams p;
  p.temperature = -0.5f;
  expect_rejected(p, "temperature", "-0.5");
  p.temperature = nan;
  expect_rejected(p, "temperature", "nan");
  p = {};
  p.top_p = 0.0f;
  expect_rejected(p, "top_p", "0");
  p.top_p = 1.5f;
  expect_rejected(p, "top_p", "1.5");
  p.top_p = nan;
  expect_rejected(p, "top_p", "nan");
  p = {};
  p.top_k = -2;
  expect_rejected(p, "top_k", "-2");
  p = {};
  p.min_p = -0.1f;
  expect_rejected(p, "min_p", "-0.1");
  p.min_p = 1.25f;
  expect_rejected(p, "min_p", "1.25");
  p = {};
  p.repetition_penalty = 0.0f;
  expect_rejected(p, "repetition_penalty", "0");
  p.repetition_penalty = -1.0f;
  expect_rejected(p, "repetition_penalty", "-1");
  p = {};
  p.presence_penalty = 2.5f;
  expect_rejected(p, "presence_penalty", "2.5");
  p = {};
  p.frequency_penalty = -3.0f;
  expect_rejected(p, "frequency_penalty", "-3");
  p = {};
  p.logit_bias = {{1000, 1.0f}};
  expect_rejected(p, "logit_bias", "1000");
  p.logit_bias = {{-1, 1.0f}};
  expect_rejected(p, "logit_bias", "-1");
  p.logit_bias = {{5, 100.5f}};
  expect_rejected(p, "logit_bias[5]", "100.5");
  p.logit_bias = {{5, nan}};
  expect_rejected(p, "logit_bias[5]", "nan");
  p = {};
  p.vocab_limit = -3;
  expect_rejected(p, "vocab_limit", "-3");
  p.vocab_limit = 1001;
  expect_rejected(p, "vocab_limit", "1001");
}

TEST(SamplingParamsValidation, LogitBiasIdsMustLieBelowTheVocabLimit) {
  SamplingParams p;
  p.vocab_limit = 900;
  p.logit_bias = {{899, 1.0f}};
  EXPECT_TRUE(validate_sampling_params(p, 1000).ok());
  p.logit_bias = {{900, 1.0f}};  // a padded row of the LM head
  expect_rejected(p, "logit_bias", "900");
}

}  // namespace
}  // namespace strata
