// StreamDecoder: deltas never split a UTF-8 character and concatenate to decode(all ids),
// over encoded random text and over random id sequences (byte-fallback runs, specials,
// invalid bytes), with and without skipping special tokens.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer/stream_decoder.h"
#include "tokenizer/unicode.h"
#include "tokenizer_test_util.h"

namespace strata::tokenizer {
namespace {

using testing::reference_tokenizer;

void expect_stream_matches(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip_special,
                           const std::string& what) {
  StreamDecoder stream(tok, skip_special);
  std::string joined;
  for (int32_t id : ids) {
    const std::string delta = stream.push(id);
    // A delta is whole characters: valid UTF-8 by itself.
    EXPECT_FALSE(find_invalid_utf8(delta).has_value()) << what;
    joined += delta;
  }
  joined += stream.finish();
  EXPECT_EQ(joined, tok.decode(ids, skip_special)) << what << " ids " << ::testing::PrintToString(ids);
}

class StreamAll : public ::testing::TestWithParam<const char*> {};

TEST_P(StreamAll, EncodedTextStreamsBackExactly) {
  const Tokenizer& tok = reference_tokenizer(GetParam());
  std::mt19937 rng(99);
  for (int i = 0; i < 150; ++i) {
    const std::string text = testing::random_text(rng);
    auto ids = tok.encode(text, /*add_special=*/true);
    ASSERT_TRUE(ids.ok());
    expect_stream_matches(tok, *ids, false, GetParam());
    expect_stream_matches(tok, *ids, true, GetParam());
  }
}

TEST_P(StreamAll, RandomIdsStreamExactly) {
  const Tokenizer& tok = reference_tokenizer(GetParam());
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> any_id(0, tok.vocab_size() - 1);
  // Byte tokens (SentencePiece <0xXX>, or the byte-level alphabet's high bytes) make
  // partial and invalid characters likely.
  std::vector<int32_t> bytes;
  for (int b = 0x80; b < 0x100; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    int32_t id = tok.piece_to_id(name);
    if (id < 0) {
      std::string ch;
      append_utf8(ch, byte_to_unicode(static_cast<uint8_t>(b)));
      id = tok.piece_to_id(ch);
    }
    if (id >= 0) bytes.push_back(id);
  }
  ASSERT_FALSE(bytes.empty());
  std::uniform_int_distribution<size_t> byte_pick(0, bytes.size() - 1);
  for (int i = 0; i < 200; ++i) {
    std::vector<int32_t> ids;
    const int n = std::uniform_int_distribution<int>(1, 40)(rng);
    for (int k = 0; k < n; ++k) ids.push_back(rng() % 3 == 0 ? bytes[byte_pick(rng)] : any_id(rng));
    expect_stream_matches(tok, ids, false, GetParam());
    expect_stream_matches(tok, ids, true, GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Reference, StreamAll,
                         ::testing::Values("qwen3", "llama3", "gemma3", "llama2", "deepseek_v3", "gptoss"));

TEST(Stream, SentencePieceLeadingSpaceAndByteRuns) {
  const Tokenizer& tok = reference_tokenizer("llama2");
  // "▁", then a word: the stream must not drop the space the full decode keeps.
  const std::vector<int32_t> ids = {tok.piece_to_id("\xE2\x96\x81"), tok.piece_to_id("\xE2\x96\x81Hello"),
                                    tok.piece_to_id("<0xF0>"), tok.piece_to_id("<0x9F>"), tok.piece_to_id("<0xA4>"),
                                    tok.piece_to_id("<0x96>"), tok.piece_to_id("\xE2\x96\x81world")};
  for (int32_t id : ids) ASSERT_GE(id, 0);
  StreamDecoder stream(tok, true);
  std::vector<std::string> deltas;
  for (int32_t id : ids) deltas.push_back(stream.push(id));
  deltas.push_back(stream.finish());
  std::string joined;
  for (const auto& d : deltas) joined += d;
  EXPECT_EQ(joined, " Hello\xF0\x9F\xA4\x96 world");
  EXPECT_EQ(joined, tok.decode(ids, true));
  // The emoji's four byte tokens come out together, only once the run is closed.
  EXPECT_EQ(deltas[2], "");
  EXPECT_EQ(deltas[5], "");
  EXPECT_EQ(deltas[6], "\xF0\x9F\xA4\x96 world");
}

}  // namespace
}  // namespace strata::tokenizer
