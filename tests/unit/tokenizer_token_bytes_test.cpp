// Tokenizer::token_bytes: the bytes of a tokenization's tokens concatenate to the encoded text
// (byte-level BPE, and SentencePiece-style BPE with byte fallback), partial UTF-8 included.
#include <gtest/gtest.h>

#include "tokenizer_test_util.h"

namespace strata::tokenizer {
namespace {

using testing::reference_tokenizer;

const char* const kTexts[] = {"Hello, world!", "{\"name\": \"Ann\", \"age\": 41}\n", "  two  spaces\tand tab",
                              "日本語のテキスト", "emoji 😀🚀 and ünïcödé", "line1\nline2\r\n"};

std::string concat(const Tokenizer& t, const std::vector<int32_t>& ids) {
  std::string out;
  for (int32_t id : ids) out += t.token_bytes(id);
  return out;
}

TEST(TokenizerTokenBytes, ByteLevelConcatenatesToTheText) {
  const Tokenizer& t = reference_tokenizer("qwen3");
  for (const char* text : kTexts) {
    auto ids = t.encode(text, false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(concat(t, *ids), text);
  }
  // A token holding part of a code point keeps its raw bytes.
  bool split = false;
  for (const char* rare : {"\U00020001", "\U0001D518", "\U0001F701", "\uA66E"}) {
    auto ids = t.encode(rare, false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(concat(t, *ids), rare);
    if (ids->size() > 1) {
      split = true;
      EXPECT_LT(t.token_bytes((*ids)[0]).size(), std::string(rare).size());
    }
  }
  EXPECT_TRUE(split) << "no test character was split across tokens";
  EXPECT_EQ(t.token_bytes(t.piece_to_id("<|im_end|>")), "<|im_end|>");
  EXPECT_EQ(t.token_bytes(-5), "");
}

TEST(TokenizerTokenBytes, SentencePieceBytesAndSpaces) {
  const Tokenizer& t = reference_tokenizer("llama2");
  for (const char* text : kTexts) {
    auto ids = t.encode(text, false);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(concat(t, *ids), std::string(" ") + text) << "the normalizer's leading space is a token byte";
  }
  EXPECT_EQ(t.token_bytes(t.piece_to_id("<0x0A>")), "\n");
  EXPECT_EQ(t.token_bytes(t.piece_to_id("\xE2\x96\x81the")), " the");
}

}  // namespace
}  // namespace strata::tokenizer
