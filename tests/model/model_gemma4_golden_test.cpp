// gemma4_text (dense and MoE) against the transformers oracle (tests/data/reference/logits.json),
// f32 compute: prompt_argmax exact at every position, last_logits within 1e-4 (max-norm
// relative), 32 greedy ids exact with one forward for the prompt and one token per step from
// the KV cache. Prompts reach 100 tokens against a sliding window of 16, and the last two
// layers read the KV of layers 3 and 2. Plus the KV layout and the batching contracts.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "golden_cases.h"
#include "model/registry.h"

namespace strata {
namespace {

std::string model_dir(const std::string& name) {
  return std::string(STRATA_SOURCE_DIR) + "/tests/data/reference/models/" + name;
}

class Gemma4Golden : public ::testing::TestWithParam<const char*> {};

TEST_P(Gemma4Golden, MatchesReference) {
  const std::string name = GetParam();
  ThreadPool pool(2);
  auto model = load_model(model_dir(name), pool);
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  EXPECT_EQ((*model)->config().model_type, "gemma4_text");
  const auto cases = golden::cases_for(name);
  ASSERT_EQ(cases.size(), 4u);
  for (size_t i = 0; i < cases.size(); ++i) {
    golden::expect_exact_case(**model, cases[i], 1e-4, name + " case " + std::to_string(i));
  }
}

INSTANTIATE_TEST_SUITE_P(Gemma4, Gemma4Golden, ::testing::Values("gemma4-tiny", "gemma4moe-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param) == "gemma4-tiny" ? "dense" : "moe";
                         });

// Layers 2 and 5 are full attention with head_dim 64 (per_layer_config); the last two layers
// own no KV and read that of the last earlier layer of their type.
TEST(Gemma4Layout, PerLayerHeadDimsWindowsAndSharing) {
  ThreadPool pool(1);
  auto model = load_model(model_dir("gemma4-tiny"), pool);
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  const auto layout = (*model)->kv_layout();
  ASSERT_EQ(layout.size(), 6u);
  const int head_dim[6] = {32, 32, 64, 32, 32, 64};
  const int window[6] = {16, 16, 0, 16, 16, 0};
  const int shares[6] = {-1, -1, -1, -1, 3, 2};
  for (int l = 0; l < 6; ++l) {
    EXPECT_EQ(layout[size_t(l)].n_kv_heads, 1) << "layer " << l;
    EXPECT_EQ(layout[size_t(l)].head_dim_k, head_dim[l]) << "layer " << l;
    EXPECT_EQ(layout[size_t(l)].head_dim_v, head_dim[l]) << "layer " << l;
    EXPECT_EQ(layout[size_t(l)].window, window[l]) << "layer " << l;
    EXPECT_EQ(layout[size_t(l)].shares_with, shares[l]) << "layer " << l;
    EXPECT_TRUE(layout[size_t(l)].has_kv) << "layer " << l;
  }
  // Only layers 0-3 hold KV: 1 head x (k + v) x 4 bytes x (32 + 32 + 64 + 32).
  EXPECT_EQ(KvStorage::bytes_per_token(layout), int64_t(2 * 4 * (32 + 32 + 64 + 32)));
}

// Logits of the last prompt token for a prompt fed in chunks (positions cross the window and
// block boundaries inside chunks) equal those of one prefill.
TEST(Gemma4Batching, ChunkedPrefillMatchesOneForward) {
  ThreadPool pool(2);
  for (const char* name : {"gemma4-tiny", "gemma4moe-tiny"}) {
    auto model = load_model(model_dir(name), pool);
    ASSERT_TRUE(model.ok()) << model.error().to_string();
    const auto c = golden::cases_for(name).back();
    const int32_t vocab = (*model)->config().vocab_size;
    SingleSequence whole(**model, int32_t(c.prompt_ids.size()));
    auto ref = whole.prefill(c.prompt_ids);
    ASSERT_TRUE(ref.ok());
    SingleSequence chunked(**model, int32_t(c.prompt_ids.size()));
    std::vector<float> last;
    for (size_t b = 0; b < c.prompt_ids.size(); b += 13) {
      const size_t e = std::min(c.prompt_ids.size(), b + 13);
      auto l = chunked.prefill(std::vector<int32_t>(c.prompt_ids.begin() + b, c.prompt_ids.begin() + e));
      ASSERT_TRUE(l.ok()) << l.error().to_string();
      last = *l;
    }
    ASSERT_EQ(last.size(), size_t(vocab));
    EXPECT_LE(golden::max_norm_rel(last.data(), std::vector<float>(ref->begin(), ref->end())), 1e-6) << name;
  }
}

// Two sequences packed in one StepBatch (one prefilling, one decoding, different block tables)
// get the logits each gets alone.
TEST(Gemma4Batching, PackedSequencesMatchAlone) {
  ThreadPool pool(2);
  auto loaded = load_model(model_dir("gemma4moe-tiny"), pool);
  ASSERT_TRUE(loaded.ok()) << loaded.error().to_string();
  Model& model = **loaded;
  const int32_t vocab = model.config().vocab_size;
  const auto cases = golden::cases_for("gemma4moe-tiny");
  const std::vector<int32_t>& a = cases[3].prompt_ids;  // 100 tokens
  const std::vector<int32_t>& b = cases[2].prompt_ids;  // 33 tokens
  constexpr int32_t kBlock = 16;
  KvStorage kv(model.kv_layout(), 32, kBlock);
  auto table = [](int32_t first, int32_t n) {
    std::vector<int32_t> t;
    for (int32_t i = 0; i < n; ++i) t.push_back(first + 2 * i);  // interleaved, not contiguous
    return t;
  };
  // Step 1: sequence A prefills its first 99 tokens alone.
  StepBatch s1;
  s1.tokens.assign(a.begin(), a.end() - 1);
  SeqSpan sa;
  sa.n_tokens = int32_t(a.size() - 1);
  sa.block_table = table(0, 7);
  s1.seqs.push_back(sa);
  std::vector<float> l1(static_cast<size_t>(vocab));
  model.forward(s1, kv, nullptr, l1.data());
  // Step 2: A decodes its last prompt token while B prefills, in one batch.
  StepBatch s2;
  s2.tokens = {a.back()};
  s2.tokens.insert(s2.tokens.end(), b.begin(), b.end());
  SeqSpan da;
  da.n_tokens = 1;
  da.pos0 = int32_t(a.size() - 1);
  da.block_table = table(0, 7);
  SeqSpan pb;
  pb.n_tokens = int32_t(b.size());
  pb.block_table = table(1, 3);
  s2.seqs = {da, pb};
  std::vector<float> l2(size_t(2 * vocab));
  model.forward(s2, kv, nullptr, l2.data());
  EXPECT_LE(golden::max_norm_rel(l2.data(), cases[3].last_logits), 1e-4);
  EXPECT_LE(golden::max_norm_rel(l2.data() + vocab, cases[2].last_logits), 1e-4);

  SingleSequence alone_a(model, int32_t(a.size()));
  auto ra = alone_a.prefill(a);
  SingleSequence alone_b(model, int32_t(b.size()));
  auto rb = alone_b.prefill(b);
  ASSERT_TRUE(ra.ok() && rb.ok());
  EXPECT_LE(golden::max_norm_rel(l2.data(), std::vector<float>(ra->begin(), ra->end())), 1e-6);
  EXPECT_LE(golden::max_norm_rel(l2.data() + vocab, std::vector<float>(rb->begin(), rb->end())), 1e-6);
}

}  // namespace
}  // namespace strata
