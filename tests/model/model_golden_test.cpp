// Every family against the transformers oracle (tests/data/reference/logits.json), f32 compute:
// prompt argmax and greedy ids exact, last logits within 1e-4 (max-norm relative).
#include <gtest/gtest.h>

#include <string>

#include "core/thread_pool.h"
#include "golden_cases.h"
#include "model/registry.h"

namespace strata {
namespace {

struct GoldenModel {
  const char* name;  // key in logits.json
  const char* dir;   // relative to the repository root
  bool oracle_attn_softcap = true;  // false: the oracle ran without the attention soft-cap (see LoadOptions)
};

// One line per model covered by the families in registry.cpp.
const GoldenModel kModels[] = {
    {"llama3-tiny", "tests/data/reference/models/llama3-tiny"},
    {"mistral-tiny", "tests/data/reference/models/mistral-tiny"},
    {"qwen2-tiny", "tests/data/reference/models/qwen2-tiny"},
    {"qwen3-tiny", "tests/data/reference/models/qwen3-tiny"},
    {"qwen3yarn-tiny", "tests/data/reference/models/qwen3yarn-tiny"},
    {"qwen3moe-tiny", "tests/data/reference/models/qwen3moe-tiny"},
    {"gemma2-tiny", "tests/data/reference/models/gemma2-tiny", /*oracle_attn_softcap=*/false},
    {"gemma3-tiny", "tests/data/reference/models/gemma3-tiny"},
    {"gemma3mm-tiny", "tests/data/reference/models/gemma3mm-tiny"},
    {"strata-demo", "models/strata-demo"},
    {"strata-demo-draft", "models/strata-demo-draft"},
};

std::string model_path(const char* dir) { return std::string(STRATA_SOURCE_DIR) + "/" + dir; }

class GoldenTest : public ::testing::TestWithParam<GoldenModel> {};

TEST_P(GoldenTest, MatchesReference) {
  const GoldenModel& gm = GetParam();
  ThreadPool pool(2);
  LoadOptions opts;
  opts.attn_softcap = gm.oracle_attn_softcap;
  auto model = load_model(model_path(gm.dir), pool, opts);
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  const auto cases = golden::cases_for(gm.name);
  ASSERT_FALSE(cases.empty()) << "no cases for " << gm.name;
  for (size_t i = 0; i < cases.size(); ++i) {
    golden::expect_exact_case(**model, cases[i], 1e-4, std::string(gm.name) + " case " + std::to_string(i));
  }
}

TEST_P(GoldenTest, TeacherForcedWithinTop5) {
  const GoldenModel& gm = GetParam();
  ThreadPool pool(2);
  LoadOptions opts;
  opts.attn_softcap = gm.oracle_attn_softcap;
  auto model = load_model(model_path(gm.dir), pool, opts);
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  const auto cases = golden::cases_for(gm.name);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE(golden::teacher_forced_mismatches(**model, cases[i]).empty()) << gm.name << " case " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GoldenTest, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<GoldenModel>& info) {
                           std::string n = info.param.name;
                           for (char& c : n) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

// Gemma 2's attention soft-cap is applied by default: the logits move away from the
// cap-free oracle, yet every greedy step stays inside the oracle's top-5.
TEST(GoldenGemma2, AttentionSoftcapIsApplied) {
  ThreadPool pool(2);
  const std::string dir = model_path("tests/data/reference/models/gemma2-tiny");
  auto capped = load_model(dir, pool);
  ASSERT_TRUE(capped.ok()) << capped.error().to_string();
  EXPECT_EQ((*capped)->config().attn_softcap, 50.0f);
  const auto cases = golden::cases_for("gemma2-tiny");
  const auto& c = cases.back();
  SingleSequence seq(**capped, int32_t(c.prompt_ids.size()));
  auto l = seq.prefill(c.prompt_ids);
  ASSERT_TRUE(l.ok());
  EXPECT_GT(golden::max_norm_rel(l->data(), c.last_logits), 1e-4);
  for (size_t i = 0; i < cases.size(); ++i) {
    EXPECT_TRUE(golden::teacher_forced_mismatches(**capped, cases[i]).empty()) << "case " << i;
  }
}

// stories260k: a trained model; BOS then 256 greedy tokens, no EOS stop.
TEST(GoldenStories, GreedyFromBos) {
  ThreadPool pool(2);
  auto model = load_model(model_path("tests/data/reference/models/stories260k"), pool);
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  const auto ref = golden::logits_json()["stories260k"]["greedy_from_bos_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(ref.size(), 257u);
  const int32_t vocab = (*model)->config().vocab_size;
  SingleSequence seq(**model, 512);
  std::vector<int32_t> got = {ref[0]};
  auto l = seq.prefill({ref[0]});
  ASSERT_TRUE(l.ok()) << l.error().to_string();
  while (got.size() < ref.size()) {
    const int32_t next = argmax(l->data(), vocab);
    got.push_back(next);
    if (got.size() == ref.size()) break;
    l = seq.step(next);
    ASSERT_TRUE(l.ok()) << l.error().to_string();
  }
  EXPECT_EQ(got, ref);
}

}  // namespace
}  // namespace strata
