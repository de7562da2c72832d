// The reference goldens (tests/data/reference/logits.json, transformers in f32) through the
// CUDA forward in bf16, by the teacher-forced rule: prefill the prompt, then feed the oracle's
// greedy tokens one step at a time; at every generated step the GPU's argmax must be among
// the oracle's top-5, and the last prompt logits must agree within 2e-2 (max-norm relative).
// A second pass prefills all of a model's prompts in one ragged batch. Needs a GPU.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "backend/cuda/cuda_model.h"
#include "gpu_test_util.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

struct Case {
  std::vector<int32_t> prompt;
  std::vector<float> last_logits;
  std::vector<int32_t> greedy;
  std::vector<std::vector<int32_t>> top5;
};

const nlohmann::json& logits_json() {
  static const nlohmann::json j = [] {
    std::ifstream in(source_dir() + "/tests/data/reference/logits.json");
    std::stringstream ss;
    ss << in.rdbuf();
    return nlohmann::json::parse(ss.str());
  }();
  return j;
}

std::vector<Case> cases_for(const std::string& model) {
  std::vector<Case> out;
  const auto& j = logits_json();
  if (!j.contains(model) || !j[model].contains("cases")) return out;
  for (const auto& c : j[model]["cases"]) {
    Case g;
    g.prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    g.last_logits = c["last_logits"].get<std::vector<float>>();
    g.greedy = c["greedy_ids"].get<std::vector<int32_t>>();
    g.top5 = c["generated_top5"].get<std::vector<std::vector<int32_t>>>();
    out.push_back(std::move(g));
  }
  return out;
}

struct GoldenModel {
  const char* name;
  const char* dir;
};
const GoldenModel kModels[] = {
    {"llama3-tiny", "tests/data/reference/models/llama3-tiny"},
    {"mistral-tiny", "tests/data/reference/models/mistral-tiny"},
    {"qwen2-tiny", "tests/data/reference/models/qwen2-tiny"},
    {"qwen3-tiny", "tests/data/reference/models/qwen3-tiny"},
    {"qwen3yarn-tiny", "tests/data/reference/models/qwen3yarn-tiny"},
    {"strata-demo", "models/strata-demo"},
    {"strata-demo-draft", "models/strata-demo-draft"},
};

class GpuGolden : public ::testing::TestWithParam<GoldenModel> {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  }
};

CudaModelOptions small_options() {
  CudaModelOptions o;
  o.kv_cache_bytes = int64_t(64) << 20;
  o.block_size = 16;
  o.max_tokens = 512;
  o.max_seqs = 8;
  o.max_blocks_per_seq = 32;
  o.max_logit_rows = 8;
  return o;
}

TEST_P(GpuGolden, TeacherForcedWithinTop5) {
  const GoldenModel& gm = GetParam();
  auto model = CudaDecoder::load(source_dir() + "/" + gm.dir, small_options());
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  CudaDecoder& m = **model;
  const int32_t vocab = m.config().vocab_size;
  const auto cases = cases_for(gm.name);
  ASSERT_FALSE(cases.empty()) << "no cases for " << gm.name;
  std::vector<float> logits(size_t(vocab) * 8);
  std::vector<int32_t> am(8);
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const Case& c = cases[ci];
    // Blocks in reverse order: the table, not the pool order, must decide where tokens live.
    SeqSpan span;
    for (int32_t b = 31; b >= 0; --b) span.block_table.push_back(b);
    span.pos0 = 0;
    span.n_tokens = int32_t(c.prompt.size());
    StepBatch batch;
    batch.tokens = c.prompt;
    batch.seqs = {span};
    ASSERT_TRUE(m.forward(batch, am.data(), logits.data()).ok());
    std::vector<float> last(logits.begin(), logits.begin() + vocab);
    EXPECT_LE(max_norm_rel(last, c.last_logits), 2e-2) << gm.name << " case " << ci << ": last_logits";
    std::vector<size_t> bad;
    for (size_t i = 0; i < c.greedy.size() && i < c.top5.size(); ++i) {
      if (std::find(c.top5[i].begin(), c.top5[i].end(), am[0]) == c.top5[i].end()) bad.push_back(i);
      if (i + 1 == c.greedy.size()) break;
      batch.seqs[0].pos0 += batch.seqs[0].n_tokens;
      batch.seqs[0].n_tokens = 1;
      batch.tokens = {c.greedy[i]};
      ASSERT_TRUE(m.forward(batch, am.data()).ok());
    }
    EXPECT_TRUE(bad.empty()) << gm.name << " case " << ci << ": " << bad.size() << " steps outside the top-5, first at "
                             << (bad.empty() ? 0 : bad[0]);
  }
}

TEST_P(GpuGolden, RaggedBatchPrefillMatchesOracle) {
  const GoldenModel& gm = GetParam();
  auto model = CudaDecoder::load(source_dir() + "/" + gm.dir, small_options());
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  CudaDecoder& m = **model;
  const int32_t vocab = m.config().vocab_size;
  const auto cases = cases_for(gm.name);
  StepBatch batch;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    SeqSpan span;
    for (int32_t b = 0; b < 8; ++b) span.block_table.push_back(int32_t(ci) * 8 + b);
    span.n_tokens = int32_t(cases[ci].prompt.size());
    batch.tokens.insert(batch.tokens.end(), cases[ci].prompt.begin(), cases[ci].prompt.end());
    batch.seqs.push_back(span);
  }
  std::vector<float> logits(size_t(vocab) * cases.size());
  std::vector<int32_t> am(cases.size());
  ASSERT_TRUE(m.forward(batch, am.data(), logits.data()).ok());
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    std::vector<float> last(logits.begin() + ci * vocab, logits.begin() + (ci + 1) * vocab);
    EXPECT_LE(max_norm_rel(last, cases[ci].last_logits), 2e-2) << gm.name << " case " << ci;
    EXPECT_NE(std::find(cases[ci].top5[0].begin(), cases[ci].top5[0].end(), am[ci]), cases[ci].top5[0].end())
        << gm.name << " case " << ci << ": first generated token";
  }
}

INSTANTIATE_TEST_SUITE_P(Families, GpuGolden, ::testing::ValuesIn(kModels),
                         [](const ::testing::TestParamInfo<GoldenModel>& info) {
                           std::string n = info.param.name;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

TEST(GpuGoldenErrors, UnsupportedFamilyAndBadStepsAreErrors) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  auto gemma = CudaDecoder::load(source_dir() + "/tests/data/reference/models/gemma2-tiny", small_options());
  ASSERT_FALSE(gemma.ok());
  EXPECT_EQ(gemma.error().code, ErrorCode::kUnsupported);
  auto model = CudaDecoder::load(source_dir() + "/tests/data/reference/models/llama3-tiny", small_options());
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  std::vector<int32_t> am(8);
  StepBatch bad_id;
  bad_id.tokens = {1, 100000};
  bad_id.seqs = {SeqSpan{2, 0, {0}}};
  EXPECT_FALSE((*model)->forward(bad_id, am.data()).ok());
  StepBatch short_table;
  short_table.tokens = std::vector<int32_t>(20, 3);
  short_table.seqs = {SeqSpan{20, 0, {0}}};  // 20 tokens need 2 blocks of 16
  EXPECT_FALSE((*model)->forward(short_table, am.data()).ok());
}

}  // namespace
}  // namespace strata::cuda
