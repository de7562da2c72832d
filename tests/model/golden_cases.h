// Reference goldens (tests/data/reference/logits.json, produced by transformers in f32) and
// the checks every family test runs against them. Header-only so any model test can use it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/model.h"
#include "model/single_sequence.h"

namespace strata::golden {

struct GoldenCase {
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> prompt_argmax;
  std::vector<float> last_logits;
  std::vector<int32_t> greedy_ids;
  std::vector<std::vector<int32_t>> generated_top5;
};

inline const nlohmann::json& logits_json() {
  static const nlohmann::json j = [] {
    std::ifstream in(std::string(STRATA_TEST_DATA) + "/reference/logits.json");
    std::stringstream ss;
    ss << in.rdbuf();
    return nlohmann::json::parse(ss.str());
  }();
  return j;
}

inline std::vector<GoldenCase> cases_for(const std::string& model) {
  std::vector<GoldenCase> out;
  const auto& j = logits_json();
  if (!j.contains(model) || !j[model].contains("cases")) return out;
  for (const auto& c : j[model]["cases"]) {
    GoldenCase g;
    g.prompt_ids = c["prompt_ids"].get<std::vector<int32_t>>();
    g.prompt_argmax = c["prompt_argmax"].get<std::vector<int32_t>>();
    g.last_logits = c["last_logits"].get<std::vector<float>>();
    g.greedy_ids = c["greedy_ids"].get<std::vector<int32_t>>();
    g.generated_top5 = c["generated_top5"].get<std::vector<std::vector<int32_t>>>();
    out.push_back(std::move(g));
  }
  return out;
}

// max|got - ref| / max|ref| (the oracle's max-norm relative error).
inline double max_norm_rel(const float* got, const std::vector<float>& ref) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num = std::max(num, std::fabs(double(got[i]) - double(ref[i])));
    den = std::max(den, std::fabs(double(ref[i])));
  }
  return den == 0.0 ? num : num / den;
}

// f32 check: prompt argmax at every position and the last logits (prefill in one forward),
// then greedy decode one token per step through the cache.
inline void expect_exact_case(Model& model, const GoldenCase& c, double logits_tol, const std::string& label) {
  const int32_t vocab = model.config().vocab_size;
  SingleSequence seq(model, int32_t(c.prompt_ids.size() + c.greedy_ids.size() + 1));
  auto pre = seq.prefill(c.prompt_ids, /*want_all_logits=*/true);
  ASSERT_TRUE(pre.ok()) << label << ": " << pre.error().to_string();
  ASSERT_EQ(pre->size(), c.prompt_ids.size() * size_t(vocab));
  for (size_t t = 0; t < c.prompt_ids.size(); ++t) {
    EXPECT_EQ(argmax(pre->data() + t * size_t(vocab), vocab), c.prompt_argmax[t]) << label << ": prompt position " << t;
  }
  const float* last = pre->data() + (c.prompt_ids.size() - 1) * size_t(vocab);
  EXPECT_LE(max_norm_rel(last, c.last_logits), logits_tol) << label << ": last_logits";
  std::vector<int32_t> got;
  int32_t next = argmax(last, vocab);
  for (size_t i = 0; i < c.greedy_ids.size(); ++i) {
    got.push_back(next);
    if (i + 1 == c.greedy_ids.size()) break;
    auto l = seq.step(next);
    ASSERT_TRUE(l.ok()) << label << ": " << l.error().to_string();
    next = argmax(l->data(), vocab);
  }
  EXPECT_EQ(got, c.greedy_ids) << label << ": greedy_ids";
}

// Lossy-backend check: feed the oracle's greedy tokens (teacher forcing); at every generated
// step the engine's argmax must be among the oracle's top-5. Returns the failing steps.
inline std::vector<size_t> teacher_forced_mismatches(Model& model, const GoldenCase& c) {
  const int32_t vocab = model.config().vocab_size;
  SingleSequence seq(model, int32_t(c.prompt_ids.size() + c.greedy_ids.size() + 1));
  std::vector<size_t> bad;
  auto l = seq.prefill(c.prompt_ids, false);
  if (!l.ok()) return {size_t(-1)};
  for (size_t i = 0; i < c.greedy_ids.size() && i < c.generated_top5.size(); ++i) {
    const int32_t a = argmax(l->data(), vocab);
    const auto& top = c.generated_top5[i];
    if (std::find(top.begin(), top.end(), a) == top.end()) bad.push_back(i);
    if (i + 1 == c.greedy_ids.size()) break;
    l = seq.step(c.greedy_ids[i]);
    if (!l.ok()) {
      bad.push_back(i);
      break;
    }
  }
  return bad;
}

}  // namespace strata::golden
