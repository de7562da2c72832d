// decode(encode(s)) == s over a generated corpus of random Unicode strings, invalid UTF-8
// rejected with its byte offset, and the strata-demo tokenizer against its logits goldens.
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer/normalizer.h"
#include "tokenizer_test_util.h"

namespace strata::tokenizer {
namespace {

using testing::random_text;
using testing::reference_tokenizer;

constexpr int kCorpusSize = 400;

void expect_round_trip(const Tokenizer& tok, const std::string& name, bool single_spaces, bool nfc) {
  std::mt19937 rng(1234);
  testing::CorpusOptions options;
  options.single_spaces_only = single_spaces;
  for (int i = 0; i < kCorpusSize; ++i) {
    std::string text = random_text(rng, options);
    if (nfc) text = normalize_unicode(text, NormalForm::kNfc);
    auto ids = tok.encode(text, /*add_special=*/false);
    ASSERT_TRUE(ids.ok()) << ids.error().to_string();
    EXPECT_EQ(tok.decode(*ids, /*skip_special=*/true), text) << name << " text " << ::testing::PrintToString(text);
    // Special tokens added by the post-processor disappear again when skipped.
    auto with_special = tok.encode(text, /*add_special=*/true);
    ASSERT_TRUE(with_special.ok());
    EXPECT_EQ(tok.decode(*with_special, true), text) << name;
  }
}

TEST(RoundTrip, ByteLevelTokenizersOnNfcText) {
  for (const char* name : {"qwen3", "llama3", "deepseek_v3", "gptoss"}) {
    expect_round_trip(reference_tokenizer(name), name, /*single_spaces=*/false, /*nfc=*/true);
  }
}

TEST(RoundTrip, SentencePieceTokenizersOnSingleSpacedText) {
  for (const char* name : {"llama2", "gemma3"}) {
    expect_round_trip(reference_tokenizer(name), name, /*single_spaces=*/true, /*nfc=*/false);
  }
}

TEST(RoundTrip, InvalidUtf8IsRejectedWithItsOffset) {
  const Tokenizer& tok = reference_tokenizer("qwen3");
  const std::vector<std::pair<std::string, size_t>> bad = {
      {"abc\xFF", 3},                 // not a UTF-8 byte
      {"ab\xC0\xAF", 2},              // overlong '/'
      {"x\xED\xA0\x80y", 1},          // a surrogate
      {"\xE4\xB8", 0},                // truncated at the end
      {"ok \xE4\xB8 ok", 3},          // truncated in the middle
      {"\xF4\x90\x80\x80", 0},        // past U+10FFFF
      {"fine \x80", 5},               // a stray continuation byte
  };
  for (const auto& [text, offset] : bad) {
    auto r = tok.encode(text, false);
    ASSERT_FALSE(r.ok()) << ::testing::PrintToString(text);
    EXPECT_EQ(r.error().code, ErrorCode::kInvalidArgument);
    EXPECT_NE(r.error().message.find("byte offset " + std::to_string(offset)), std::string::npos) << r.error().message;
  }
  EXPECT_TRUE(tok.encode("\xF0\x9F\x98\x80 \xE4\xB8\xAD", false).ok());
}

// encode() is const and shared by request threads: concurrent calls (sharing the word
// cache) give the single-thread ids.
TEST(RoundTrip, ConcurrentEncodesAgree) {
  const Tokenizer& tok = reference_tokenizer("qwen3");
  std::mt19937 rng(3);
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 200; ++i) {
    texts.push_back(random_text(rng));
    want.push_back(*tok.encode(texts.back(), false));
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      const Tokenizer copy = tok;  // copies share the state
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          const size_t k = (i * 7 + static_cast<size_t>(t) * 13) % texts.size();
          if (*copy.encode(texts[k], false) != want[k]) ++mismatches[static_cast<size_t>(t)];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(DemoModel, LoadsAndMatchesLogitsGoldens) {
  auto loaded = Tokenizer::load(std::string(STRATA_SOURCE_DIR) + "/models/strata-demo");
  ASSERT_TRUE(loaded.ok()) << loaded.error().to_string();
  const Tokenizer& tok = *loaded;
  EXPECT_EQ(tok.vocab_size(), 4096);
  EXPECT_EQ(tok.eos_token(), "<|im_end|>");
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.bos_id(), -1);
  EXPECT_TRUE(tok.is_special(1));
  auto tmpl = tok.chat_template_source();
  ASSERT_TRUE(tmpl.ok());
  EXPECT_NE(tmpl->find("<|im_start|>"), std::string::npos);
  EXPECT_EQ(tok.generation_eos_ids(), std::vector<int32_t>{2});
  EXPECT_EQ(tok.stop_ids(), std::vector<int32_t>{2});

  const auto logits = nlohmann::json::parse(testing::read_file(std::string(STRATA_TEST_DATA) + "/reference/logits.json"));
  for (const char* model : {"strata-demo", "strata-demo-draft"}) {
    for (const auto& c : logits.at(model).at("cases")) {
      const std::string text = c.at("text").get<std::string>();
      auto ids = tok.encode(text, true);
      ASSERT_TRUE(ids.ok());
      EXPECT_EQ(*ids, c.at("prompt_ids").get<std::vector<int32_t>>()) << text;
      EXPECT_EQ(tok.decode(c.at("greedy_ids").get<std::vector<int32_t>>(), true), c.at("greedy_text").get<std::string>());
    }
  }
  expect_round_trip(tok, "strata-demo", false, false);
}

}  // namespace
}  // namespace strata::tokenizer
