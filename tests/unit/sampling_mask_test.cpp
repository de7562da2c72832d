// Constrained decoding pieces below the engine: the sampler's token mask (removed ids are never
// drawn, the mask applies after bias and before temperature) and the date formats a schema's
// `format` compiles to (every accepted date exists; February 29 only in leap years).
#include <gtest/gtest.h>

#include <vector>

#include "sampling/grammar/grammar.h"
#include "sampling/sampler.h"

namespace strata {
namespace {

TEST(SamplerMask, RemovedIdsAreNeverDrawn) {
  const int32_t vocab = 100;
  std::vector<float> logits(vocab, 0.0f);
  logits[7] = 50.0f;  // the unmasked argmax
  std::vector<uint32_t> words((vocab + 31) / 32, 0u);
  for (int32_t id : {3, 41, 90}) words[id >> 5] |= 1u << (id & 31);
  const TokenMask mask{words.data(), vocab};
  SamplingParams p;
  p.temperature = 1.0f;
  p.seed = 5;
  p.has_seed = true;
  auto s = Sampler::create(p, vocab);
  ASSERT_TRUE(s.ok());
  int counts[vocab] = {};
  for (int i = 0; i < 3000; ++i) ++counts[s->sample(logits.data(), vocab, &mask)];
  EXPECT_EQ(counts[3] + counts[41] + counts[90], 3000);
  EXPECT_GT(counts[3], 800);  // equal logits: about a third each
  EXPECT_GT(counts[90], 800);
  // Greedy under the mask: the best allowed id, not the raw argmax.
  p.temperature = 0.0f;
  logits[41] = 2.0f;
  auto g = Sampler::create(p, vocab);
  EXPECT_EQ(g->sample(logits.data(), vocab, &mask), 41);
  // Ids past the mask's width are removed too; the distribution agrees.
  const TokenMask narrow{words.data(), 50};
  EXPECT_EQ(g->sample(logits.data(), vocab, &narrow), 41);
  std::vector<float> probs(vocab);
  auto d = Sampler::create(SamplingParams{}, vocab);
  d->distribution(logits.data(), vocab, probs.data(), &narrow);
  EXPECT_EQ(probs[90], 0.0f);
  EXPECT_EQ(probs[7], 0.0f);
  EXPECT_NEAR(probs[3] + probs[41], 1.0f, 1e-6);
}

TEST(SamplerMask, AppliesAfterLogitBias) {
  const int32_t vocab = 64;
  std::vector<float> logits(vocab, 0.0f);
  std::vector<uint32_t> words(2, 0u);
  words[0] = (1u << 1) | (1u << 2);
  SamplingParams p;
  p.temperature = 0.0f;
  p.logit_bias = {{2, 5.0f}, {9, 50.0f}};  // 9 is masked out: its bias cannot bring it back
  auto s = Sampler::create(p, vocab);
  ASSERT_TRUE(s.ok());
  const TokenMask mask{words.data(), vocab};
  EXPECT_EQ(s->sample(logits.data(), vocab, &mask), 2);
}

bool matches_date(const std::string& format, const std::string& text) {
  auto g = grammar::compile_json_schema(R"({"type":"string","format":")" + format + R"("})", {});
  EXPECT_TRUE(g.ok());
  std::vector<std::string> toks;
  for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, char(b)));
  toks.push_back("");
  auto v = grammar::Vocabulary::create(toks, {}, {256});
  grammar::Matcher m(std::make_shared<const grammar::TokenMaskCache>(*g, *v));
  return m.accept_bytes("\"" + text + "\"") && m.can_terminate();
}

TEST(GrammarFormats, DatesExist) {
  for (const char* ok : {"2024-02-29", "2000-02-29", "1999-12-31", "0001-01-01", "1838-06-30", "2023-11-30", "1600-02-29"}) {
    EXPECT_TRUE(matches_date("date", ok)) << ok;
  }
  for (const char* bad : {"2023-02-29", "1900-02-29", "1838-06-31", "3659-11-31", "0000-01-01", "2023-13-01", "2023-02-30"}) {
    EXPECT_FALSE(matches_date("date", bad)) << bad;
  }
  EXPECT_TRUE(matches_date("date-time", "2024-02-29T12:30:00Z"));
  EXPECT_FALSE(matches_date("date-time", "2023-04-31T12:30:00Z"));
}

}  // namespace
}  // namespace strata
