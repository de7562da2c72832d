// Generation checkpoints with speculation on: a speculating request checkpoints (after the
// accepted run that crosses each multiple of checkpoint_every), the engine stops mid-way, and
// a new speculating engine over the same directories resumes the identical request with exactly
// the tokens of an uninterrupted plain run, greedy and seeded.
#include <gtest/gtest.h>

#include <filesystem>

#include "../support/engine_test_support.h"

namespace strata {
namespace {

using namespace strata::test;
namespace fs = std::filesystem;

class EngineSpecCheckpointTest : public ::testing::TestWithParam<std::tuple<std::string, bool>> {};

TEST_P(EngineSpecCheckpointTest, ResumesWithThePlainRunsTokens) {
  const std::string name = std::get<0>(GetParam());
  const bool seeded = std::get<1>(GetParam());
  ThreadPool pool(2);
  const fs::path dir = fs::temp_directory_path() /
                       ("strata_spec_ckpt_" + name + (seeded ? "_s_" : "_g_") + std::to_string(::getpid()));
  fs::remove_all(dir);
  GenerationRequest r = greedy_request("spec-ckpt", {}, 64);
  for (int k = 0; k < 40; ++k) r.prompt.push_back(int32_t(3 + mix(uint64_t(k % 9)) % 500));  // repeats: n-gram drafts
  if (seeded) {
    r.sampling.temperature = 0.8f;
    r.sampling.seed = 99;
    r.sampling.has_seed = true;
  }
  Outcome full;
  {
    auto e = make_engine(name, pool, EngineOptions{});
    ASSERT_TRUE(e);
    full = run(*e, r);
  }
  ASSERT_EQ(full.tokens.size(), 64u);
  EngineOptions o;
  o.kv_disk_dir = dir.string();
  o.checkpoint_every = 8;
  o.speculative.method = "ngram";
  o.speculative.adaptive = false;
  std::vector<int32_t> seen;
  {
    auto e = make_engine(name, pool, o);
    ASSERT_TRUE(e);
    auto s = e->submit(r);
    ASSERT_TRUE(s.ok());
    while (seen.size() < 24) {
      auto ev = (*s)->next(std::chrono::seconds(300));
      if (!ev || ev->final) break;
      seen.insert(seen.end(), ev->tokens.begin(), ev->tokens.end());
    }
    e->shutdown();
    for (;;) {
      auto ev = (*s)->next(std::chrono::seconds(10));
      if (!ev) break;
      seen.insert(seen.end(), ev->tokens.begin(), ev->tokens.end());
      if (ev->final) {
        EXPECT_EQ(ev->finish_reason, FinishReason::kCancelled);
        break;
      }
    }
  }
  ASSERT_GE(seen.size(), 24u);
  ASSERT_LT(seen.size(), full.tokens.size());
  EXPECT_TRUE(std::equal(seen.begin(), seen.end(), full.tokens.begin()));
  auto e = make_engine(name, pool, o);
  ASSERT_TRUE(e);
  auto again = r;
  again.id = "spec-ckpt-again";
  auto s = e->submit(again);
  ASSERT_TRUE(s.ok());
  size_t first_event = 0;
  Outcome got;
  for (;;) {
    auto ev = (*s)->next(std::chrono::seconds(300));
    ASSERT_TRUE(ev);
    if (first_event == 0) first_event = ev->tokens.size();
    got.tokens.insert(got.tokens.end(), ev->tokens.begin(), ev->tokens.end());
    if (ev->final) {
      got.final = *ev;
      break;
    }
  }
  EXPECT_EQ(got.tokens, full.tokens);
  EXPECT_GE(first_event, 16u) << "resumed from a checkpoint past 16 tokens";
  EXPECT_EQ(got.final.finish_reason, FinishReason::kLength);
  EXPECT_GT(got.final.usage.draft_tokens, 0);
  // The disk tier's writer may still be adding files: stop the engine before the directory goes.
  e->shutdown();
  e.reset();
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Models, EngineSpecCheckpointTest,
                         ::testing::Combine(::testing::Values("qwen3-tiny", "strata-demo"), ::testing::Bool()),
                         [](const auto& info) {
                           std::string s = std::get<0>(info.param) + (std::get<1>(info.param) ? "_seeded" : "_greedy");
                           for (char& ch : s) if (ch == '-') ch = '_';
                           return s;
                         });

}  // namespace
}  // namespace strata
