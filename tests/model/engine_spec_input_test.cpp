// Speculative options the engine refuses at start, each naming the flag and the value: draft
// counts outside [1, 16], an unknown method, a draft model without --speculative draft and the
// reverse, a draft with another vocabulary, a draft whose context is shorter than
// --max-model-len, and an executor that cannot verify drafts. A draft of another family with
// the target's vocabulary is accepted and changes no output.
#include <gtest/gtest.h>

#include <memory>

#include "../support/engine_test_support.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/registry.h"
#include "runtime/host/model_runner.h"

namespace strata {
namespace {

using namespace strata::test;

std::unique_ptr<Model> load(const std::string& name, ThreadPool& pool) {
  auto m = load_model(model_dir(name), pool);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().to_string());
  return m.ok() ? std::move(m).value() : nullptr;
}

// The engine's refusal of `o` on `target`; every `want` must be in its message.
void expect_refused(const std::string& target, EngineOptions o, std::initializer_list<std::string> want) {
  ThreadPool pool(1);
  o.kv_blocks = 64;
  auto e = Engine::create(load(target, pool), o);
  ASSERT_FALSE(e.ok()) << "accepted";
  for (const auto& w : want) EXPECT_NE(e.error().message.find(w), std::string::npos) << e.error().message << " lacks " << w;
}

TEST(EngineSpecInput, DraftCountsOutsideOneToSixteenAreRefused) {
  for (int32_t k : {0, -1, 17, 100}) {
    EngineOptions o;
    o.speculative.method = "ngram";
    o.speculative.num_draft_tokens = k;
    expect_refused("qwen3-tiny", o, {"--num-draft-tokens", std::to_string(k)});
  }
}

TEST(EngineSpecInput, UnknownMethodsAndMismatchedFlagsAreRefused) {
  EngineOptions o;
  o.speculative.method = "eagle";
  expect_refused("qwen3-tiny", o, {"--speculative", "eagle"});
  o.speculative.method = "draft";
  expect_refused("qwen3-tiny", o, {"--speculative draft", "--draft-model"});
  ThreadPool pool(1);
  o.speculative.method = "ngram";
  o.speculative.draft_model_dir = "qwen3-tiny";
  o.speculative.draft_model = load("qwen3-tiny", pool);
  expect_refused("qwen3-tiny", o, {"--draft-model qwen3-tiny", "--speculative draft"});
}

TEST(EngineSpecInput, DraftWithAnotherVocabularyIsRefused) {
  ThreadPool pool(1);
  EngineOptions o;
  o.speculative.method = "draft";
  o.speculative.draft_model_dir = "strata-demo-draft";
  o.speculative.draft_model = load("strata-demo-draft", pool);
  expect_refused("qwen3-tiny", o, {"--draft-model strata-demo-draft", "4096", "512"});
}

TEST(EngineSpecInput, DraftWithAShorterContextIsRefused) {
  ThreadPool pool(1);
  EngineOptions o;
  o.speculative.method = "draft";
  o.speculative.draft_model_dir = "stories260k";
  o.speculative.draft_model = load("stories260k", pool);
  o.max_model_len = 1024;
  expect_refused("qwen3-tiny", o, {"--draft-model stories260k", "512", "--max-model-len 1024"});
}

// Forwards to a host ModelRunner but does not verify drafts (as the GPU executor for now).
class PlainExecutor final : public StepExecutor {
 public:
  PlainExecutor(Model& m, int32_t n_blocks) : runner_(m, m.kv_layout(), n_blocks, 16) {}
  const StepRows& run(const StepPlan& p, const std::vector<uint8_t>& w, std::span<const RowSample> s) override {
    return runner_.run(p, w, s);
  }
  int32_t vocab() const override { return runner_.vocab(); }
  int32_t n_kv_blocks() const override { return runner_.n_kv_blocks(); }
  bool device_argmax() const override { return false; }
  int64_t state_floats() const override { return 0; }
  void save_state(int32_t, float*) override {}
  void load_state(int32_t, const float*) override {}
  std::vector<int64_t> block_tensor_bytes() const override { return runner_.block_tensor_bytes(); }
  void read_block(int32_t b, uint8_t* out) override { runner_.read_block(b, out); }
  void write_block(int32_t b, const uint8_t* in) override { runner_.write_block(b, in); }

 private:
  ModelRunner runner_;
};

TEST(EngineSpecInput, ExecutorsThatCannotVerifyDraftsAreRefused) {
  ThreadPool pool(1);
  auto m = load("qwen3-tiny", pool);
  ASSERT_TRUE(m);
  auto exec = std::make_unique<PlainExecutor>(*m, 64);
  EngineOptions o;
  o.speculative.method = "ngram";
  auto e = Engine::create(std::move(m), o, std::move(exec));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message.find("--speculative ngram"), std::string::npos) << e.error().message;
  EXPECT_NE(e.error().message.find("cannot verify"), std::string::npos) << e.error().message;
  // Off, the same executor runs.
  auto m2 = load("qwen3-tiny", pool);
  auto exec2 = std::make_unique<PlainExecutor>(*m2, 64);
  EXPECT_TRUE(Engine::create(std::move(m2), EngineOptions{}, std::move(exec2)).ok());
}

TEST(EngineSpecInput, ADraftOfAnotherFamilyChangesNoOutput) {
  ThreadPool pool(2);
  EngineOptions plain;
  plain.kv_blocks = 128;
  plain.max_model_len = 512;
  auto base = make_engine("qwen3-tiny", pool, plain);
  ASSERT_TRUE(base);
  EngineOptions o = plain;
  o.speculative.method = "draft";
  o.speculative.adaptive = false;
  o.speculative.draft_model_dir = "stories260k";
  o.speculative.draft_model = load("stories260k", pool);
  auto spec = make_engine("qwen3-tiny", pool, o);
  ASSERT_TRUE(spec);
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r = greedy_request("r" + std::to_string(i), {}, 40);
    for (int k = 0; k < 20 + 9 * i; ++k) r.prompt.push_back(int32_t(3 + mix(uint64_t(i * 100 + k)) % 509));
    if (i % 2) {
      r.sampling.temperature = 0.7f;
      r.sampling.seed = 5 + uint64_t(i);
      r.sampling.has_seed = true;
    }
    const Outcome want = run(*base, r);
    const Outcome got = run(*spec, r);
    EXPECT_EQ(got.tokens, want.tokens) << r.id;
    EXPECT_GT(got.final.usage.draft_tokens, 0) << r.id;
  }
}

}  // namespace
}  // namespace strata
