// Front ends: draft 2020-12 cases of tests/data/grammar/schema_2020_12.json, strict mode,
// whitespace options, json_object, GBNF, choice lists, the compile cache, and bad input (each
// error names the keyword, construct or limit).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "sampling/grammar/grammar.h"

namespace strata::grammar {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const Vocabulary> byte_vocab() {
  static auto v = [] {
    std::vector<std::string> toks;
    for (int b = 0; b < 256; ++b) toks.push_back(std::string(1, char(b)));
    toks.push_back("");
    return *Vocabulary::create(toks, {}, {256});
  }();
  return v;
}

bool matches(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(std::make_shared<const TokenMaskCache>(g, byte_vocab()));
  return m.accept_bytes(text) && m.can_terminate();
}

std::shared_ptr<const Grammar> schema(const std::string& text, JsonSchemaOptions o = {}) {
  auto g = compile_json_schema(text, o);
  EXPECT_TRUE(g.ok()) << text << ": " << (g.ok() ? "" : g.error().message);
  return g.ok() ? *g : nullptr;
}

TEST(GrammarJsonSchema, Draft2020Cases) {
  std::ifstream in(std::string(STRATA_TEST_DATA) + "/grammar/schema_2020_12.json");
  ASSERT_TRUE(in);
  const auto cases = ojson::parse(in);
  int checked = 0;
  for (const auto& c : cases) {
    auto g = schema(c["schema"].dump());
    ASSERT_NE(g, nullptr) << c["description"];
    for (const auto& t : c["tests"]) {
      EXPECT_EQ(matches(g, t["data"].dump()), t["valid"].get<bool>())
          << c["description"] << " / " << t["description"] << ": " << t["data"].dump();
      ++checked;
    }
  }
  EXPECT_GE(checked, 90);
}

TEST(GrammarJsonSchema, StrictModeRequiresEveryPropertyInOrder) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"integer"},"b":{"type":"string"}}})";
  JsonSchemaOptions strict;
  strict.strict = true;
  auto g = schema(s, strict);
  EXPECT_TRUE(matches(g, R"({"a":1,"b":"x"})"));
  EXPECT_FALSE(matches(g, R"({"a":1})"));
  EXPECT_FALSE(matches(g, R"({"b":"x","a":1})"));
  EXPECT_FALSE(matches(g, R"({"a":1,"b":"x","c":2})"));
  auto lax = schema(s);
  EXPECT_TRUE(matches(lax, R"({"a":1})"));
  EXPECT_TRUE(matches(lax, R"({})"));
  EXPECT_TRUE(matches(lax, R"({"a":1,"c":[true],"b":"x","d":null})"));
  EXPECT_FALSE(matches(lax, R"({"a":"1"})"));
  EXPECT_FALSE(matches(lax, R"({"a":1,"a":2})"));
  auto closed = schema(R"({"type":"object","properties":{"a":{"type":"integer"}},"additionalProperties":false})");
  EXPECT_TRUE(matches(closed, R"({"a":1})"));
  EXPECT_FALSE(matches(closed, R"({"a":1,"b":2})"));
}

TEST(GrammarJsonSchema, Whitespace) {
  const std::string s = R"({"type":"object","properties":{"a":{"type":"array","items":{"type":"integer"}}},"required":["a"]})";
  auto compact = schema(s);
  JsonSchemaOptions flex;
  flex.whitespace = JsonWhitespace::kFlexible;
  auto flexible = schema(s, flex);
  EXPECT_TRUE(matches(compact, R"({"a":[1,2]})"));
  EXPECT_FALSE(matches(compact, R"({"a": [1, 2]})"));
  EXPECT_TRUE(matches(flexible, "{ \"a\" :\n\t[ 1 , 2 ] }"));
  EXPECT_TRUE(matches(flexible, R"({"a":[1,2]})"));
}

TEST(GrammarJsonSchema, JsonObject) {
  auto g = compile_json_object();
  ASSERT_TRUE(g.ok());
  EXPECT_TRUE(matches(*g, R"({})"));
  EXPECT_TRUE(matches(*g, R"({"a":[1,{"b":null}],"c":"\u00e9\n","d":-1.5e3})"));
  EXPECT_FALSE(matches(*g, R"([1])"));
  EXPECT_FALSE(matches(*g, R"({"a":01})"));
  EXPECT_FALSE(matches(*g, R"({"a":1,})"));
}

TEST(GrammarEbnf, Gbnf) {
  auto g = compile_ebnf(R"G(
    # arithmetic over small integers
    root ::= expr
    expr ::= term (("+" | "-") term)*
    term ::= num | "(" expr ")"
    num  ::= [1-9] [0-9]{0,2} | "0"
  )G");
  ASSERT_TRUE(g.ok()) << g.error().message;
  for (std::string s : {"1", "12+3", "(1-2)+(30)", "999", "0"}) EXPECT_TRUE(matches(*g, s)) << s;
  for (std::string s : {"", "1+", "(1", "1000", "01", "a"}) EXPECT_FALSE(matches(*g, s)) << s;

  auto h = compile_ebnf("root ::= \"\\\"\" [^\"\\n]* \"\\\"\" name?\nname ::= [a-zA-Z_é]+ \"\\x21\"");
  ASSERT_TRUE(h.ok()) << h.error().message;
  EXPECT_TRUE(matches(*h, "\"hi there\""));
  EXPECT_TRUE(matches(*h, "\"\"café!"));
  EXPECT_FALSE(matches(*h, "\"a\nb\""));
}

TEST(GrammarChoice, ExactlyOneOfTheStrings) {
  GrammarSpec spec{GrammarKind::kChoice, R"(["yes","no","yes please"])", {}};
  auto g = compile(spec);
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_TRUE(matches(*g, "yes"));
  EXPECT_TRUE(matches(*g, "yes please"));
  EXPECT_FALSE(matches(*g, "yes no"));
  EXPECT_FALSE(matches(*g, "n"));
  auto empty = compile(GrammarSpec{GrammarKind::kChoice, "[]", {}});
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.error().message.find("empty"), std::string::npos);
}

TEST(GrammarCache, SharesCompiledGrammarsAndMasks) {
  GrammarCache cache(2);
  GrammarSpec a{GrammarKind::kJsonSchema, R"({"type":"integer"})", {}};
  GrammarSpec a_strict = a;
  a_strict.json.strict = true;
  GrammarSpec b{GrammarKind::kRegex, "[a-z]+", {}};
  auto g1 = cache.get(a);
  auto g2 = cache.get(a);
  ASSERT_TRUE(g1.ok() && g2.ok());
  EXPECT_EQ(g1->get(), g2->get());
  EXPECT_EQ(cache.hits(), 1u);
  auto g3 = cache.get(a_strict);  // options are part of the key
  ASSERT_TRUE(g3.ok());
  EXPECT_NE(g3->get(), g1->get());
  auto m1 = cache.get_masks(a_strict, byte_vocab());
  auto m2 = cache.get_masks(a_strict, byte_vocab());
  ASSERT_TRUE(m1.ok() && m2.ok());
  EXPECT_EQ(m1->get(), m2->get());
  (void)cache.get(b);  // capacity 2: evicts `a`
  EXPECT_EQ(cache.size(), 2u);
  const uint64_t misses = cache.misses();
  (void)cache.get(a);
  EXPECT_EQ(cache.misses(), misses + 1);
  GrammarSpec bad{GrammarKind::kJsonSchema, "{", {}};
  EXPECT_FALSE(cache.get(bad).ok());
  EXPECT_FALSE(cache.get(bad).ok());
  EXPECT_EQ(cache.misses(), misses + 2);  // the error was cached
}

struct BadCase {
  const char* schema;
  ErrorCode code;
  std::vector<const char*> names;  // substrings the message must contain
};

TEST(GrammarBadInput, SchemaErrorsNameTheProblem) {
  const std::vector<BadCase> cases = {
      {R"({"type":"object",)", ErrorCode::kInvalidArgument, {"invalid JSON"}},
      {R"({"type":"object","frobnicate":1})", ErrorCode::kUnsupported, {"'frobnicate'", "root"}},
      {R"({"properties":{"a":{"not":{"type":"string"}}}})", ErrorCode::kUnsupported, {"'not'", "/properties/a"}},
      {R"({"type":"string","pattern":"a(b"})", ErrorCode::kInvalidArgument, {"pattern", "a(b", "missing ')'"}},
      {R"({"type":"string","format":"hostname"})", ErrorCode::kUnsupported, {"format 'hostname'"}},
      {R"({"type":"array","minItems":3,"maxItems":2})", ErrorCode::kInvalidArgument, {"minItems 3 > maxItems 2", "unsatisfiable"}},
      {R"({"enum":[]})", ErrorCode::kInvalidArgument, {"enum", "empty"}},
      {R"({"allOf":[{"type":"string"},{"type":"integer"}]})", ErrorCode::kInvalidArgument, {"no common type"}},
      {R"({"$ref":"https://example.com/s.json"})", ErrorCode::kUnsupported, {"$ref 'https://example.com/s.json'"}},
      {R"({"$ref":"#/$defs/missing"})", ErrorCode::kInvalidArgument, {"'#/$defs/missing'", "does not resolve"}},
      {R"({"type":"strin"})", ErrorCode::kInvalidArgument, {"unknown type \"strin\""}},
      {R"({"type":"array","items":{"type":"integer"},"uniqueItems":true})", ErrorCode::kUnsupported, {"uniqueItems"}},
      {R"({"type":"number","multipleOf":0.5})", ErrorCode::kUnsupported, {"multipleOf on type number"}},
      {R"({"type":"number","minimum":2.5,"exclusiveMaximum":2.5})", ErrorCode::kInvalidArgument, {"unsatisfiable"}},
      {R"({"type":"integer","enum":["a"]})", ErrorCode::kInvalidArgument, {"unsatisfiable"}},
      {R"({"type":"object","properties":{"a":false},"required":["a"]})", ErrorCode::kInvalidArgument, {"'a'", "unsatisfiable"}},
      {R"({"type":"string","maxLength":1000000})", ErrorCode::kResourceExhausted, {"maxLength", "limit"}},
      {R"(false)", ErrorCode::kInvalidArgument, {"unsatisfiable"}},
  };
  for (const auto& c : cases) {
    auto g = compile_json_schema(c.schema, {});
    ASSERT_FALSE(g.ok()) << c.schema;
    EXPECT_EQ(g.error().code, c.code) << c.schema << ": " << g.error().to_string();
    for (const char* n : c.names) EXPECT_NE(g.error().message.find(n), std::string::npos) << c.schema << ": " << g.error().message;
  }
}

TEST(GrammarBadInput, SchemasPastTheLimits) {
  // Each level refers to the next twice with sibling keywords, so it is expanded inline:
  // 2^24 copies unless a limit stops it.
  ojson defs = ojson::object();
  for (int i = 0; i < 24; ++i) {
    const std::string next = "#/$defs/l" + std::to_string(i + 1);
    defs["l" + std::to_string(i)] = {{"oneOf", ojson::array({{{"$ref", next}, {"minLength", 1}}, {{"$ref", next}, {"maxLength", 9}}})}};
  }
  defs["l24"] = {{"type", "string"}};
  const ojson bomb = {{"$defs", defs}, {"$ref", "#/$defs/l0"}};
  Limits lim;
  lim.max_compile_ms = 1000;
  lim.max_nodes = 100000;
  auto g = compile_json_schema(bomb.dump(), {}, lim);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().code, ErrorCode::kResourceExhausted) << g.error().to_string();

  std::string deep = R"({"type":"string"})";
  for (int i = 0; i < 300; ++i) deep = R"({"type":"array","items":)" + deep + "}";
  auto d = compile_json_schema(deep, {});
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.error().code, ErrorCode::kResourceExhausted);
  EXPECT_NE(d.error().message.find("nested deeper than"), std::string::npos) << d.error().message;
}

TEST(GrammarBadInput, EbnfErrorsNameTheRule) {
  struct Bad {
    const char* text;
    const char* names;
  };
  for (Bad b : {Bad{"root ::= a", "rule 'a' is used but not defined"}, Bad{"start ::= \"x\"", "no 'root' rule"},
                Bad{"root ::= \"x\" )", "unexpected ')'"}, Bad{"root ::= [a-", "unterminated"},
                Bad{"root ::= x\nx ::= x \"a\" | \"b\"", "'x' is left-recursive"}, Bad{"root ::= \"a\"{3,1}", "max < min"},
                Bad{"root ::= \"a\"\nroot ::= \"b\"", "defined twice"}, Bad{"root = \"a\"", "expected '::='"}}) {
    auto g = compile_ebnf(b.text);
    ASSERT_FALSE(g.ok()) << b.text;
    EXPECT_NE(g.error().message.find(b.names), std::string::npos) << b.text << ": " << g.error().message;
  }
}

TEST(GrammarJsonSchema, CoverageTable) {
  const auto& t = json_schema_keywords();
  EXPECT_GE(t.size(), 15u);
  bool unique = false;
  for (const auto& k : t) unique |= std::string(k.keyword) == "uniqueItems";
  EXPECT_TRUE(unique);
}

}  // namespace
}  // namespace strata::grammar
