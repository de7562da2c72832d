// Matcher over hand-built grammars and small vocabularies: masks equal a brute-force check of
// every token, rollback restores exactly, forced continuation is the one possible next text.
#include <gtest/gtest.h>

#include <random>
#include <thread>

#include "sampling/grammar/ir.h"
#include "sampling/grammar/matcher.h"

namespace strata::grammar {
namespace {

// root ::= "[" (item ("," item)*)? "]" ; item ::= "\"" [a-c]* "\"" | [0-9]+ | "{\"k\":" item "}"
std::shared_ptr<const Grammar> list_grammar() {
  GrammarBuilder b;
  RuleId root = b.add_rule("root"), item = b.add_rule("item");
  ByteSet abc, digit;
  abc.add_range('a', 'c');
  digit.add_range('0', '9');
  b.set_rule(item, b.alt({b.seq({b.literal("\""), b.star(b.bytes(abc)), b.literal("\"")}), b.plus(b.bytes(digit)),
                          b.seq({b.literal("{\"k\":"), b.ref(item), b.literal("}")})}));
  b.set_rule(root, b.seq({b.literal("["), b.opt(b.seq({b.ref(item), b.star(b.seq({b.literal(","), b.ref(item)}))})),
                          b.literal("]")}));
  auto g = b.build(root);
  EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.error().message);
  return *g;
}

std::shared_ptr<const Vocabulary> random_vocab(uint32_t seed, int n) {
  std::mt19937 rng(seed);
  const std::string alphabet = "[]\",abc019{}k:";
  std::vector<std::string> toks;
  toks.push_back("");  // id 0: stop (EOS)
  for (char c : alphabet) toks.push_back(std::string(1, c));
  while (static_cast<int>(toks.size()) < n) {
    std::string t;
    const int len = 1 + static_cast<int>(rng() % 5);
    for (int i = 0; i < len; ++i) t += alphabet[rng() % alphabet.size()];
    toks.push_back(t);
  }
  toks.push_back("");  // a special id with no text
  auto v = Vocabulary::create(toks, {static_cast<int32_t>(toks.size() - 1)}, {0});
  EXPECT_TRUE(v.ok());
  return *v;
}

// Brute force: token allowed iff accepting its bytes keeps the matcher alive.
std::vector<uint32_t> brute_mask(Matcher& m, const Vocabulary& v) {
  std::vector<uint32_t> w(v.mask_words(), 0);
  for (int32_t id = 0; id < v.size(); ++id) {
    bool ok;
    if (v.is_stop(id)) ok = m.can_terminate();
    else if (v.is_special(id)) ok = false;
    else ok = m.can_accept_bytes(v.token(id));
    if (ok) w[id >> 5] |= 1u << (id & 31);
  }
  return w;
}

std::vector<int32_t> allowed(const std::vector<uint32_t>& w, int32_t n) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < n; ++id)
    if ((w[id >> 5] >> (id & 31)) & 1) ids.push_back(id);
  return ids;
}

TEST(GrammarMatcher, AcceptsAndRejectsStrings) {
  auto g = list_grammar();
  auto v = random_vocab(1, 50);
  auto cache = std::make_shared<TokenMaskCache>(g, v);
  for (std::string s : {"[]", "[\"ab\"]", "[1,22,\"\"]", "[{\"k\":{\"k\":\"a\"}}]"}) {
    Matcher m(cache);
    EXPECT_TRUE(m.accept_bytes(s)) << s;
    EXPECT_TRUE(m.can_terminate()) << s;
  }
  for (std::string s : {"[,]", "[\"d\"]", "[1,]", "[]]", "{", "[01x"}) {
    Matcher m(cache);
    EXPECT_FALSE(m.accept_bytes(s) && m.can_terminate()) << s;
  }
  Matcher m(cache);
  EXPECT_TRUE(m.accept_bytes("[1"));
  EXPECT_FALSE(m.can_terminate());
  EXPECT_FALSE(m.accept_bytes("x"));
  EXPECT_TRUE(m.accept_bytes("]"));
  EXPECT_FALSE(m.accept_bytes("]"));
}

TEST(GrammarMatcher, MaskEqualsBruteForceOnRandomWalks) {
  auto g = list_grammar();
  for (uint32_t seed = 1; seed <= 6; ++seed) {
    auto v = random_vocab(seed, 400);
    auto cache = std::make_shared<TokenMaskCache>(g, v);
    Matcher m(cache, 64);
    std::mt19937 rng(seed * 77);
    std::vector<uint32_t> w(v->mask_words());
    int checked = 0;
    for (int step = 0; step < 60; ++step) {
      m.fill_next_token_bitmask(w.data());
      auto brute = brute_mask(m, *v);
      ASSERT_EQ(allowed(w, v->size()), allowed(brute, v->size())) << "seed " << seed << " step " << step;
      ++checked;
      auto ids = allowed(w, v->size());
      if (ids.empty()) break;
      const int32_t pick = ids[rng() % ids.size()];
      ASSERT_TRUE(m.accept_token(pick));
      if (m.is_terminated()) break;
    }
    EXPECT_GT(checked, 1);
  }
}

TEST(GrammarMatcher, RollbackRestoresExactly) {
  auto g = list_grammar();
  auto v = random_vocab(3, 300);
  auto cache = std::make_shared<TokenMaskCache>(g, v);
  Matcher m(cache, 8);
  std::mt19937 rng(5);
  std::vector<std::vector<uint32_t>> masks;
  std::vector<uint32_t> w(v->mask_words());
  std::vector<int32_t> picked;
  for (int step = 0; step < 8; ++step) {
    m.fill_next_token_bitmask(w.data());
    masks.push_back(w);
    auto ids = allowed(w, v->size());
    std::erase(ids, 0);  // keep going: never the stop id
    ASSERT_FALSE(ids.empty());
    picked.push_back(ids[rng() % ids.size()]);
    ASSERT_TRUE(m.accept_token(picked.back()));
  }
  EXPECT_FALSE(m.rollback(9));
  for (int back = 1; back <= 8; ++back) {
    ASSERT_TRUE(m.rollback(1));
    m.fill_next_token_bitmask(w.data());
    EXPECT_EQ(w, masks[8 - back]) << "after rolling back " << back;
  }
  // Replaying the same tokens gives the same masks again.
  for (int step = 0; step < 8; ++step) {
    m.fill_next_token_bitmask(w.data());
    EXPECT_EQ(w, masks[step]);
    ASSERT_TRUE(m.accept_token(picked[step]));
  }
}

TEST(GrammarMatcher, ForcedContinuation) {
  auto g = list_grammar();
  auto v = random_vocab(2, 200);
  auto cache = std::make_shared<TokenMaskCache>(g, v);
  Matcher m(cache);
  EXPECT_EQ(m.forced_bytes(), "[");
  ASSERT_TRUE(m.accept_bytes("[{"));
  EXPECT_EQ(m.forced_bytes(), "\"k\":");
  std::string tiled;
  for (int32_t id : m.forced_tokens()) tiled += v->token(id);
  EXPECT_EQ(tiled, "\"k\":");
  ASSERT_TRUE(m.accept_bytes("\"k\":1"));
  EXPECT_EQ(m.forced_bytes(), "");  // a digit or the closing brace
}

TEST(GrammarMatcher, StopOnlyWhereGrammarEnds) {
  auto g = list_grammar();
  auto v = random_vocab(4, 100);
  auto cache = std::make_shared<TokenMaskCache>(g, v);
  Matcher m(cache);
  EXPECT_FALSE(m.accept_token(0));
  ASSERT_TRUE(m.accept_bytes("[]"));
  std::vector<uint32_t> w(v->mask_words());
  m.fill_next_token_bitmask(w.data());
  EXPECT_EQ(allowed(w, v->size()), std::vector<int32_t>{0});
  EXPECT_FALSE(m.accept_token(v->size() - 1));  // special
  EXPECT_TRUE(m.accept_token(0));
  EXPECT_TRUE(m.is_terminated());
  EXPECT_FALSE(m.accept_bytes("["));
  EXPECT_TRUE(m.rollback(1));
  EXPECT_FALSE(m.is_terminated());
}

// Matchers on several threads share one cache that fills while they run; every thread sees
// the masks a single-threaded walk computes.
TEST(GrammarMatcher, SharedCacheAcrossThreads) {
  auto g = list_grammar();
  auto v = random_vocab(9, 2000);
  std::vector<int32_t> walk;
  std::vector<std::vector<uint32_t>> expected;
  {
    Matcher m(std::make_shared<TokenMaskCache>(g, v));
    std::mt19937 rng(11);
    std::vector<uint32_t> w(v->mask_words());
    for (int step = 0; step < 40; ++step) {
      m.fill_next_token_bitmask(w.data());
      expected.push_back(w);
      auto ids = allowed(w, v->size());
      std::erase(ids, 0);
      if (ids.empty()) break;
      int32_t pick = ids[rng() % ids.size()];
      for (int k = 0; k < 16 && v->token(pick).find(']') != std::string::npos; ++k) pick = ids[rng() % ids.size()];
      walk.push_back(pick);
      ASSERT_TRUE(m.accept_token(walk.back()));
    }
  }
  auto shared = std::make_shared<const TokenMaskCache>(g, v);
  std::vector<int> mismatches(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      Matcher m(shared);
      std::vector<uint32_t> w(v->mask_words());
      for (size_t i = 0; i < walk.size(); ++i) {
        m.fill_next_token_bitmask(w.data());
        mismatches[t] += w != expected[i];
        if (!m.accept_token(walk[i])) ++mismatches[t];
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
  EXPECT_GT(walk.size(), 10u);
}

TEST(GrammarBuild, RefusesLeftRecursionAndEmptyLanguage) {
  {
    GrammarBuilder b;
    RuleId e = b.add_rule("expr");
    b.set_rule(e, b.alt({b.seq({b.ref(e), b.literal("+")}), b.literal("x")}));
    auto g = b.build(e);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.error().message.find("left-recursive"), std::string::npos) << g.error().message;
  }
  {
    GrammarBuilder b;
    RuleId r = b.add_rule("root");
    b.set_rule(r, b.seq({b.literal("a"), b.nothing()}));
    auto g = b.build(r);
    ASSERT_FALSE(g.ok());
    EXPECT_NE(g.error().message.find("matches no string"), std::string::npos);
  }
  {
    Limits lim;
    lim.max_nodes = 100;
    GrammarBuilder b(lim);
    RuleId r = b.add_rule("root");
    b.set_rule(r, b.repeat(b.literal("abc"), 50, 50));
    auto g = b.build(r);
    ASSERT_FALSE(g.ok());
    EXPECT_EQ(g.error().code, ErrorCode::kResourceExhausted);
  }
}

}  // namespace
}  // namespace strata::grammar
