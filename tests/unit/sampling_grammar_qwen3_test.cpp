// Token masks on the real qwen3 vocabulary (151,936 ids): the bitmask equals a brute-force check
// of every token (does accepting its bytes keep the matcher alive) at random states of several
// schemas; rollback restores exactly; forced continuation; the qwen3 encodings of the sample
// outputs in tests/data/grammar/sample_outputs.json are accepted token by token.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "sampling/grammar/grammar.h"

namespace strata::grammar {
namespace {

constexpr int32_t kQwen3Vocab = 151936;

// tokenizer.json (byte-level BPE) -> token bytes per id; added tokens marked special keep their
// text and never match; <|endoftext|> and <|im_end|> stop.
std::shared_ptr<const Vocabulary> qwen3_vocab() {
  static std::shared_ptr<const Vocabulary> cached = [] {
    const std::string path = std::string(STRATA_TEST_DATA) + "/reference/tokenizers/qwen3/tokenizer.json.xz";
    FILE* p = popen(("xz -dc '" + path + "'").c_str(), "r");
    std::string text;
    char buf[1 << 16];
    for (size_t n; p && (n = fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
    if (p) pclose(p);
    const auto j = nlohmann::json::parse(text);
    std::vector<std::string> toks(kQwen3Vocab);
    for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it)
      toks[it.value().get<int32_t>()] = byte_level_piece_bytes(it.key());
    std::vector<int32_t> special, stop;
    for (const auto& t : j["added_tokens"]) {
      const int32_t id = t["id"].get<int32_t>();
      toks[id] = t["content"].get<std::string>();
      const std::string& c = toks[id];
      if (c == "<|endoftext|>" || c == "<|im_end|>") stop.push_back(id);
      else if (t["special"].get<bool>()) special.push_back(id);
    }
    auto v = Vocabulary::create(std::move(toks), special, stop);
    return v.ok() ? *v : nullptr;
  }();
  return cached;
}

std::vector<int32_t> allowed(const std::vector<uint32_t>& w, int32_t n) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < n; ++id)
    if ((w[id >> 5] >> (id & 31)) & 1) ids.push_back(id);
  return ids;
}

std::vector<uint32_t> brute_mask(Matcher& m, const Vocabulary& v) {
  std::vector<uint32_t> w(v.mask_words(), 0);
  for (int32_t id = 0; id < v.size(); ++id) {
    const bool ok = v.is_stop(id) ? m.can_terminate() : !v.is_special(id) && !v.token(id).empty() && m.can_accept_bytes(v.token(id));
    if (ok) w[id >> 5] |= 1u << (id & 31);
  }
  return w;
}

nlohmann::ordered_json samples() {
  std::ifstream in(std::string(STRATA_TEST_DATA) + "/grammar/sample_outputs.json");
  return nlohmann::ordered_json::parse(in);  // keys in file order: the schemas' property order
}

TEST(GrammarQwen3, VocabularyLoads) {
  auto v = qwen3_vocab();
  ASSERT_NE(v, nullptr);
  EXPECT_EQ(v->size(), kQwen3Vocab);
  EXPECT_EQ(v->stop_ids().size(), 2u);
  EXPECT_GT(v->sorted().size(), 151000u);
}

TEST(GrammarQwen3, SampleOutputsAcceptedTokenByToken) {
  auto v = qwen3_vocab();
  ASSERT_NE(v, nullptr);
  std::vector<uint32_t> w(v->mask_words());
  for (const auto& s : samples()) {
    auto g = compile_json_schema(s["schema"].dump(), {});
    ASSERT_TRUE(g.ok()) << g.error().message;
    auto masks = std::make_shared<const TokenMaskCache>(*g, v);
    Matcher m(masks);
    std::string text;
    for (int32_t id : s["qwen3_ids"]) {
      m.fill_next_token_bitmask(w.data());
      ASSERT_TRUE((w[id >> 5] >> (id & 31)) & 1) << s["name"] << ": token " << id << " after '" << text << "' masked out";
      ASSERT_TRUE(m.accept_token(id));
      text += v->token(id);
    }
    EXPECT_EQ(text, s["output"].get<std::string>());
    EXPECT_TRUE(m.can_terminate());
    m.fill_next_token_bitmask(w.data());
    EXPECT_EQ(allowed(w, v->size()), v->stop_ids()) << s["name"] << ": only a stop id after the closing brace";
  }
}

TEST(GrammarQwen3, MaskEqualsBruteForceAtRandomStates) {
  auto v = qwen3_vocab();
  ASSERT_NE(v, nullptr);
  std::vector<std::string> schemas;
  for (const auto& s : samples()) schemas.push_back(s["schema"].dump());
  schemas.push_back(R"({"type":"object","properties":{"n":{"type":"integer","multipleOf":7},"s":{"type":"string","pattern":"^[a-z]{2,5}(-[0-9]+)?$"}}})");
  std::mt19937 rng(18);
  std::vector<uint32_t> w(v->mask_words());
  int compared = 0;
  for (size_t k = 0; k < schemas.size(); ++k) {
    auto g = compile_json_schema(schemas[k], {});
    ASSERT_TRUE(g.ok()) << g.error().message;
    auto masks = std::make_shared<const TokenMaskCache>(*g, v);
    Matcher m(masks, 64);
    std::string text;
    for (int step = 0; step < 30 && !m.is_terminated(); ++step) {
      m.fill_next_token_bitmask(w.data());
      auto ids = allowed(w, v->size());
      if (step % 3 == 0) {
        ASSERT_EQ(ids, allowed(brute_mask(m, *v), v->size())) << "schema " << k << " after '" << text << "'";
        ++compared;
      }
      ASSERT_FALSE(ids.empty());
      // Prefer short tokens so walks cover several keys, not one long string.
      int32_t pick = ids[rng() % ids.size()];
      for (int t = 0; t < 8 && v->token(pick).size() > 3; ++t) pick = ids[rng() % ids.size()];
      ASSERT_TRUE(m.accept_token(pick));
      text += v->is_stop(pick) ? "<stop>" : v->token(pick);
    }
  }
  EXPECT_GE(compared, 40);
}

TEST(GrammarQwen3, RollbackRestoresMasks) {
  auto v = qwen3_vocab();
  ASSERT_NE(v, nullptr);
  auto s = samples()[0];
  auto g = compile_json_schema(s["schema"].dump(), {});
  ASSERT_TRUE(g.ok());
  auto masks = std::make_shared<const TokenMaskCache>(*g, v);
  Matcher m(masks, 16);
  std::vector<std::vector<uint32_t>> before;
  std::vector<uint32_t> w(v->mask_words());
  const auto ids = s["qwen3_ids"].get<std::vector<int32_t>>();
  for (size_t i = 0; i < 20; ++i) {
    m.fill_next_token_bitmask(w.data());
    before.push_back(w);
    ASSERT_TRUE(m.accept_token(ids[i]));
  }
  ASSERT_TRUE(m.rollback(12));  // a rejected draft of 12 tokens
  m.fill_next_token_bitmask(w.data());
  EXPECT_EQ(w, before[8]);
  for (size_t i = 8; i < 20; ++i) ASSERT_TRUE(m.accept_token(ids[i]));
  EXPECT_FALSE(m.rollback(17));  // beyond the kept history
}

TEST(GrammarQwen3, ForcedContinuation) {
  auto v = qwen3_vocab();
  ASSERT_NE(v, nullptr);
  JsonSchemaOptions strict;
  strict.strict = true;
  auto g = compile_json_schema(R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"role":{"const":"admin"}}})", strict);
  ASSERT_TRUE(g.ok()) << g.error().message;
  auto masks = std::make_shared<const TokenMaskCache>(*g, v);
  Matcher m(masks);
  EXPECT_EQ(m.forced_bytes(), "{\"name\":\"");
  std::string tiled;
  for (int32_t id : m.forced_tokens()) tiled += v->token(id);
  EXPECT_EQ(tiled, "{\"name\":\"");
  ASSERT_TRUE(m.accept_bytes("{\"name\":\"Ann\""));
  EXPECT_EQ(m.forced_bytes(), ",\"age\":");
  ASSERT_TRUE(m.accept_bytes(",\"age\":41"));
  EXPECT_EQ(m.forced_bytes(), "");  // another digit, or the comma
  ASSERT_TRUE(m.accept_bytes(","));
  EXPECT_EQ(m.forced_bytes(), "\"role\":\"admin\"}");
}

}  // namespace
}  // namespace strata::grammar
