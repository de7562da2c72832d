// Model::forward over packed StepBatches: several sequences in one forward, chunked prefill,
// scattered block tables and spans without logits give bit-identical logits to running each
// sequence alone (the kernels reduce every row in a fixed order).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "golden_cases.h"
#include "model/registry.h"

namespace strata {
namespace {

std::string model_dir(const std::string& name) { return std::string(STRATA_TEST_DATA) + "/reference/models/" + name; }

// Logits of every position of `ids` run alone, in one prefill.
std::vector<float> alone(Model& m, const std::vector<int32_t>& ids) {
  SingleSequence seq(m, int32_t(ids.size()));
  auto l = seq.prefill(ids, true);
  EXPECT_TRUE(l.ok());
  return l.ok() ? *l : std::vector<float>{};
}

class BatchTest : public ::testing::TestWithParam<const char*> {};

TEST_P(BatchTest, PackedChunkedAndScatteredMatchAlone) {
  ThreadPool pool(2);
  auto model = load_model(model_dir(GetParam()), pool);
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  Model& m = **model;
  const int32_t V = m.config().vocab_size;
  const auto cases = golden::cases_for(GetParam());
  ASSERT_GE(cases.size(), 4u);
  const std::vector<int32_t>& a = cases[3].prompt_ids;  // 100 ids: crosses blocks and sliding windows
  const std::vector<int32_t>& b = cases[2].prompt_ids;  // 33 ids
  const std::vector<float> ref_a = alone(m, a), ref_b = alone(m, b);

  const int32_t bs = 16;
  KvStorage kv(m.kv_layout(), 32, bs);
  // Scattered, interleaved block ids: a takes odd ids from the top, b even ids.
  std::vector<int32_t> table_a, table_b;
  for (int i = 0; i < 8; ++i) table_a.push_back(31 - 2 * i);
  for (int i = 0; i < 4; ++i) table_b.push_back(2 * i);

  // Step 1: a's first 40 tokens (all logits) with b's whole prompt (last logits only).
  // Step 2: a's other 60 tokens (last logits). Step 3: one decode token of each, b first.
  auto span = [&](int32_t n, int32_t pos0, const std::vector<int32_t>& table, bool all, bool last) {
    SeqSpan s;
    s.n_tokens = n;
    s.pos0 = pos0;
    s.block_table = table;
    s.logits_all = all;
    s.logits_last = last;
    return s;
  };
  StepBatch s1;
  s1.tokens.assign(a.begin(), a.begin() + 40);
  s1.tokens.insert(s1.tokens.end(), b.begin(), b.end());
  s1.seqs = {span(40, 0, table_a, true, true), span(int32_t(b.size()), 0, table_b, false, true)};
  std::vector<float> l1(size_t(s1.n_logit_rows()) * size_t(V));
  m.forward(s1, kv, nullptr, l1.data());
  ASSERT_EQ(s1.n_logit_rows(), 41);
  for (int t = 0; t < 40; ++t) {
    EXPECT_EQ(0, std::memcmp(&l1[size_t(t) * V], &ref_a[size_t(t) * V], size_t(V) * 4)) << "a position " << t;
  }
  EXPECT_EQ(0, std::memcmp(&l1[size_t(40) * V], &ref_b[(b.size() - 1) * V], size_t(V) * 4)) << "b last";

  StepBatch s2;
  s2.tokens.assign(a.begin() + 40, a.end());
  s2.seqs = {span(60, 40, table_a, false, true)};
  std::vector<float> l2(static_cast<size_t>(V));
  m.forward(s2, kv, nullptr, l2.data());
  EXPECT_EQ(0, std::memcmp(l2.data(), &ref_a[(a.size() - 1) * V], size_t(V) * 4)) << "a last after chunked prefill";

  // Decode one token each, b first this time; compare with the same tokens run alone.
  const int32_t next_a = argmax(l2.data(), V), next_b = argmax(&l1[size_t(40) * V], V);
  StepBatch s3;
  s3.tokens = {next_b, next_a};
  s3.seqs = {span(1, int32_t(b.size()), table_b, false, true), span(1, int32_t(a.size()), table_a, false, true)};
  std::vector<float> l3(2 * size_t(V));
  m.forward(s3, kv, nullptr, l3.data());
  std::vector<int32_t> a2 = a, b2 = b;
  a2.push_back(next_a);
  b2.push_back(next_b);
  const auto ref_a2 = alone(m, a2), ref_b2 = alone(m, b2);
  EXPECT_EQ(0, std::memcmp(&l3[0], &ref_b2[(b2.size() - 1) * V], size_t(V) * 4)) << "b decode";
  EXPECT_EQ(0, std::memcmp(&l3[size_t(V)], &ref_a2[(a2.size() - 1) * V], size_t(V) * 4)) << "a decode";
}

INSTANTIATE_TEST_SUITE_P(Families, BatchTest,
                         ::testing::Values("llama3-tiny", "qwen2-tiny", "qwen3moe-tiny", "gemma2-tiny", "gemma3-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           for (char& c : n) {
                             if (!isalnum(static_cast<unsigned char>(c))) c = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace strata
