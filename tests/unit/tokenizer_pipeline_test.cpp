// The tokenizer.json features the six reference tokenizers do not all exercise, on small
// hand-written tokenizers: both merge formats, merge order, ignore_merges, byte fallback and
// unk fusing, added-token lstrip / rstrip / single_word / normalized, normalizers,
// pre-tokenizers, and errors for what strata does not support.
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <utf8proc.h>

#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace strata::tokenizer {
namespace {

using json = nlohmann::json;
using Ids = std::vector<int32_t>;

json base_model() {
  return json{{"type", "BPE"},
              {"vocab", {{"<unk>", 0}, {"a", 1}, {"b", 2}, {"c", 3}, {"d", 4}, {"ab", 5}, {"bc", 6}, {"abc", 7},
                         {" ", 8}, {"1", 9}, {"2", 10}, {"12", 11}, {"x", 12}}},
              {"merges", json::array({"b c", "a b", "ab c", "1 2"})},
              {"unk_token", "<unk>"}};
}

Tokenizer make(json spec) {
  if (!spec.contains("model")) spec["model"] = base_model();
  auto t = Tokenizer::from_json(spec.dump(), "");
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().to_string());
  return std::move(*t);
}

Ids enc(const Tokenizer& t, const std::string& text, bool add_special = false) {
  auto r = t.encode(text, add_special);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return r.ok() ? *r : Ids{};
}

TEST(Bpe, MergeRankOrderDecides) {
  // "b c" outranks "a b": abc -> a + bc, and "a bc" is no merge, so no "abc".
  EXPECT_EQ(enc(make(json::object()), "abc"), (Ids{1, 6}));
  json model = base_model();
  model["merges"] = json::array({"a b", "ab c", "b c"});
  EXPECT_EQ(enc(make(json{{"model", model}}), "abc"), (Ids{7}));
}

TEST(Bpe, PairMergesEqualStringMerges) {
  json model = base_model();
  model["merges"] = json::array({json::array({"a", "b"}), json::array({"ab", "c"}), json::array({"b", "c"})});
  EXPECT_EQ(enc(make(json{{"model", model}}), "abcab"), (Ids{7, 5}));
}

TEST(Bpe, MergeOutsideVocabularyIsAnError) {
  json spec{{"model", base_model()}};
  spec["model"]["merges"].push_back("c d");  // "cd" is not in the vocabulary
  auto t = Tokenizer::from_json(spec.dump(), "");
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.error().message.find("c d"), std::string::npos) << t.error().message;
}

TEST(Bpe, IgnoreMergesTakesWholeWords) {
  json model = base_model();
  model["merges"] = json::array({"b c", "a b"});  // merging alone gives a + bc
  EXPECT_EQ(enc(make(json{{"model", model}}), "abc"), (Ids{1, 6}));
  model["ignore_merges"] = true;
  EXPECT_EQ(enc(make(json{{"model", model}}), "abc"), (Ids{7}));
}

TEST(Bpe, UnknownCharactersFuseOrFallBackToBytes) {
  json model = base_model();
  EXPECT_EQ(enc(make(json{{"model", model}}), "a\xC3\xA9\xC3\xA9" "b"), (Ids{1, 0, 0, 2}));
  model["fuse_unk"] = true;
  EXPECT_EQ(enc(make(json{{"model", model}}), "a\xC3\xA9\xC3\xA9" "b"), (Ids{1, 0, 2}));
  model["vocab"]["<0xC3>"] = 20;
  model["vocab"]["<0xA9>"] = 21;
  model["byte_fallback"] = true;
  const Tokenizer t = make(json{{"model", model}, {"decoder", {{"type", "Sequence"}, {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}}}});
  const Ids ids = enc(t, "a\xC3\xA9" "b");
  EXPECT_EQ(ids, (Ids{1, 20, 21, 2}));
  EXPECT_EQ(t.decode(ids, false), "a\xC3\xA9" "b");
  EXPECT_EQ(t.decode(Ids{1, 20, 2}, false), "a\xEF\xBF\xBD" "b");  // a lone lead byte
  model.erase("unk_token");
  model["byte_fallback"] = false;
  EXPECT_EQ(enc(make(json{{"model", model}}), "a\xE2\x82\xAC" "b"), (Ids{5}));  // dropped without unk
}

json added(int id, const std::string& content, bool special, json flags = json::object()) {
  json t{{"id", id}, {"content", content}, {"special", special}, {"single_word", false},
         {"lstrip", false}, {"rstrip", false}, {"normalized", !special}};
  for (auto it = flags.begin(); it != flags.end(); ++it) t[it.key()] = it.value();
  return t;
}

TEST(AddedTokens, MatchedBeforeTheModelLongestFirst) {
  const Tokenizer t = make(json{{"added_tokens", json::array({added(30, "<s>", true), added(31, "<s>x", true)})},
                                {"pre_tokenizer", {{"type", "WhitespaceSplit"}}}});
  EXPECT_EQ(enc(t, "a<s>b<s>xc"), (Ids{1, 30, 2, 31, 3}));
  EXPECT_TRUE(t.is_special(30));
  EXPECT_FALSE(t.is_special(1));
  EXPECT_EQ(t.vocab_size(), 32);
  EXPECT_EQ(t.decode(Ids{1, 30, 2}, true), "a b");  // no decoder: tokens joined by spaces
  EXPECT_EQ(t.id_to_piece(31), "<s>x");
  EXPECT_EQ(t.piece_to_id("<s>"), 30);
}

TEST(AddedTokens, LstripRstripSwallowSpaces) {
  const Tokenizer t = make(json{{"added_tokens", json::array({added(30, "<m>", true, {{"lstrip", true}, {"rstrip", true}})})}});
  EXPECT_EQ(enc(t, "a  <m>  b"), (Ids{1, 30, 2}));
  const Tokenizer plain = make(json{{"added_tokens", json::array({added(30, "<m>", true)})}});
  EXPECT_EQ(enc(plain, "a <m> b"), (Ids{1, 8, 30, 8, 2}));
}

TEST(AddedTokens, SingleWordOnlyMatchesWholeWords) {
  const Tokenizer t = make(json{{"added_tokens", json::array({added(30, "dd", false, {{"single_word", true}})})}});
  EXPECT_EQ(enc(t, "a dd b"), (Ids{1, 8, 30, 8, 2}));
  EXPECT_EQ(enc(t, "add"), (Ids{1, 4, 4}));
}

TEST(AddedTokens, NormalizedTokensMatchTheNormalizedText) {
  // Lowercase runs first: "ABC" normalizes to "abc", which the normalized token matches.
  const Tokenizer t = make(json{{"normalizer", {{"type", "Lowercase"}}},
                                {"added_tokens", json::array({added(30, "ABC", false, {{"normalized", true}}),
                                                              added(31, "D", true)})}});
  EXPECT_EQ(enc(t, "xAbCx"), (Ids{12, 30, 12}));
  EXPECT_EQ(enc(t, "Dd"), (Ids{31, 4}));  // the raw "D" is matched before lowercasing
}

TEST(Normalizers, SequenceOfStripNfkcReplacePrepend) {
  const Tokenizer t = make(json{{"normalizer",
                                 {{"type", "Sequence"},
                                  {"normalizers", json::array({{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                                                               {{"type", "NFKC"}},
                                                               {{"type", "Replace"}, {"pattern", {{"Regex", "[0-9]+"}}}, {"content", "12"}},
                                                               {{"type", "Prepend"}, {"prepend", "x"}}})}}}});
  // "\xEF\xBD\x81" is fullwidth 'a' (NFKC -> a); the digits become "12".
  EXPECT_EQ(enc(t, "  \xEF\xBD\x81" "987  "), (Ids{12, 1, 11}));
  EXPECT_EQ(enc(t, "   "), Ids{});  // empty after strip: nothing prepended
}

TEST(PreTokenizers, DigitsAndSplitBehaviors) {
  const Tokenizer digits = make(json{{"pre_tokenizer", {{"type", "Digits"}, {"individual_digits", true}}}});
  EXPECT_EQ(enc(digits, "a12"), (Ids{1, 9, 10}));
  const Tokenizer grouped = make(json{{"pre_tokenizer", {{"type", "Digits"}, {"individual_digits", false}}}});
  EXPECT_EQ(enc(grouped, "a12"), (Ids{1, 11}));
  // Removed drops the matches; MergedWithNext glues each to what follows.
  const Tokenizer removed = make(json{{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"String", "d"}}}, {"behavior", "Removed"}}}});
  EXPECT_EQ(enc(removed, "abdc"), (Ids{5, 3}));
  const Tokenizer next = make(json{{"pre_tokenizer", {{"type", "Split"}, {"pattern", {{"Regex", "b"}}}, {"behavior", "MergedWithNext"}}}});
  EXPECT_EQ(enc(next, "abc"), (Ids{1, 6}));
}

TEST(PreTokenizers, MetaspaceSplitsAndDecoderRestoresSpaces) {
  json model = base_model();
  model["vocab"]["\xE2\x96\x81"] = 40;
  model["vocab"]["\xE2\x96\x81" "a"] = 41;
  model["merges"].push_back("\xE2\x96\x81 a");
  const Tokenizer t = make(json{{"model", model},
                                {"pre_tokenizer", {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}, {"split", true}}},
                                {"decoder", {{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}}}});
  const Ids ids = enc(t, "a ab");
  // "▁ab": "a b" outranks "▁ a", leaving ▁ + ab.
  EXPECT_EQ(ids, (Ids{41, 40, 5}));
  EXPECT_EQ(t.decode(ids, false), "a ab");
}

TEST(PostProcessor, TemplateAddsBosAndEos) {
  json tp{{"type", "TemplateProcessing"},
          {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                                  {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}})},
          {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {30}}, {"tokens", {"<s>"}}}},
                              {"</s>", {{"id", "</s>"}, {"ids", {31}}, {"tokens", {"</s>"}}}}}}};
  const Tokenizer t = make(json{{"post_processor", tp},
                                {"added_tokens", json::array({added(30, "<s>", true), added(31, "</s>", true)})}});
  EXPECT_EQ(enc(t, "ab", true), (Ids{30, 5, 31}));
  EXPECT_EQ(enc(t, "ab", false), (Ids{5}));
}

TEST(Errors, UnsupportedPiecesAreNamed) {
  for (const auto& [key, spec] : std::vector<std::pair<std::string, json>>{
           {"normalizer", {{"type", "Precompiled"}}},
           {"pre_tokenizer", {{"type", "UnicodeScripts"}}},
           {"decoder", {{"type", "CTC"}}},
           {"post_processor", {{"type", "Mystery"}}}}) {
    json full{{"model", base_model()}, {key, spec}};
    auto t = Tokenizer::from_json(full.dump(), "");
    ASSERT_FALSE(t.ok()) << key;
    EXPECT_NE(t.error().message.find(spec["type"].get<std::string>()), std::string::npos) << t.error().message;
  }
  json wordpiece{{"model", {{"type", "WordPiece"}, {"vocab", json::object()}}}};
  EXPECT_FALSE(Tokenizer::from_json(wordpiece.dump(), "").ok());
  EXPECT_FALSE(Tokenizer::from_json("{not json", "").ok());
  EXPECT_FALSE(Tokenizer::load("/nonexistent/dir").ok());
}

TEST(Config, SpecialTokensTemplatesAndStopIds) {
  json spec{{"model", base_model()},
            {"added_tokens", json::array({added(30, "<s>", true), added(31, "</s>", true), added(32, "<|im_end|>", true),
                                          added(33, "<|eot_id|>", true)})}};
  json config{{"bos_token", {{"__type", "AddedToken"}, {"content", "<s>"}}},
              {"eos_token", "</s>"},
              {"chat_template", json::array({{{"name", "default"}, {"template", "{{ m }}<|im_end|>"}},
                                             {{"name", "tool_use"}, {"template", "tools"}}})}};
  auto t = Tokenizer::from_json(spec.dump(), config.dump());
  ASSERT_TRUE(t.ok()) << t.error().to_string();
  EXPECT_EQ(t->bos_id(), 30);
  EXPECT_EQ(t->eos_id(), 31);
  EXPECT_EQ(t->bos_token(), "<s>");
  EXPECT_EQ(*t->chat_template_source(), "{{ m }}<|im_end|>");
  EXPECT_EQ(*t->chat_template_source("tool_use"), "tools");
  EXPECT_FALSE(t->chat_template_source("nope").ok());
  // <|eot_id|> is special but no template mentions it.
  EXPECT_EQ(t->stop_ids({7}), (Ids{7, 31, 32}));
}

}  // namespace
}  // namespace strata::tokenizer

namespace strata::tokenizer {
namespace {

std::string utf8(std::initializer_list<uint32_t> cps) {
  std::string s;
  for (uint32_t cp : cps) append_utf8(s, cp);
  return s;
}

// NFC straight from utf8proc, bypassing strata's fast path.
std::string utf8proc_nfc(const std::string& s) {
  utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(s.c_str()));
  std::string r(reinterpret_cast<const char*>(out));
  std::free(out);
  return r;
}

// The NFC fast path skips utf8proc for text of "inert" code points; check that claim
// against utf8proc itself over the whole code space.
TEST(Normalizers, NfcInertCodePointsAreLeftAloneByNfc) {
  std::vector<uint32_t> first_elements;  // inert code points that start compositions
  for (uint32_t cp = 0; cp <= 0x10FFFF; ++cp) {
    if (cp >= 0xD800 && cp <= 0xDFFF) continue;
    if (!is_nfc_inert(cp)) continue;
    const std::string s = utf8({cp});
    if (cp == 0) continue;  // NUL ends utf8proc's C string
    ASSERT_EQ(utf8proc_nfc(s), s) << std::hex << cp;
    const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
    if (p->comb_index != UINT16_MAX) first_elements.push_back(cp);
  }
  // No inert code point composes with an inert starter before it.
  std::vector<uint32_t> all_first = first_elements;
  for (uint32_t b : first_elements) {
    for (uint32_t a : all_first) {
      const std::string s = utf8({a, b});
      ASSERT_EQ(utf8proc_nfc(s), s) << std::hex << a << " " << b;
    }
  }
  EXPECT_FALSE(is_nfc_inert(0x0301));  // combining acute
  EXPECT_FALSE(is_nfc_inert(0x212B));  // ANGSTROM SIGN -> Å
  EXPECT_FALSE(is_nfc_inert(0x0B3E));  // a starter that is a second element
  EXPECT_FALSE(is_nfc_inert(0x11A8));  // Hangul trailing jamo
  EXPECT_TRUE(is_nfc_inert(0x4E2D));
  EXPECT_TRUE(is_nfc_inert(0x00E9));
  EXPECT_EQ(normalize_unicode(utf8({'e', 0x301}), NormalForm::kNfc), utf8({0xE9}));
  // Random mixes of starters, marks (out of canonical order too), jamo and singletons:
  // the piecewise fast path equals utf8proc on the whole string.
  const uint32_t pool[] = {'a', 'e', 'A', ' ', 0xE9, 0x301, 0x300, 0x323, 0x307, 0x1100, 0x1161, 0x11A8, 0xAC00,
                           0x212B, 0x1F71, 0x0B47, 0x0B3E, 0x304B, 0x3099, 0x4E2D, 0x094D, 0x0915, 0x1F600, 0x0344};
  std::mt19937 rng(5);
  for (int i = 0; i < 20000; ++i) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < n; ++k) append_utf8(s, pool[rng() % std::size(pool)]);
    ASSERT_EQ(normalize_unicode(s, NormalForm::kNfc), utf8proc_nfc(s)) << ::testing::PrintToString(s);
  }
  EXPECT_EQ(normalize_unicode(utf8({0x1100, 0x1161, 0x11A8}), NormalForm::kNfc), utf8({0xAC01}));
}

}  // namespace
}  // namespace strata::tokenizer
