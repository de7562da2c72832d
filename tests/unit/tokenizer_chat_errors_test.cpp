// Template errors: every failure of a chat template (syntax, raise_exception, unknown
// filter, type errors, runaway loops or recursion) is an Error naming the template line,
// never a crash or an exception escaping ChatTemplate.
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"

namespace strata::tokenizer {
namespace {

using ojson = nlohmann::ordered_json;

// The Error of parsing or rendering `src`; fails the test when both succeed.
Error render_error(const std::string& src, const ojson& ctx = ojson::object()) {
  auto t = ChatTemplate::parse(src);
  if (!t.ok()) return t.error();
  auto out = t->render_ordered(ctx);
  EXPECT_FALSE(out.ok()) << "rendered: " << (out.ok() ? *out : "");
  return out.ok() ? Error{} : out.error();
}

void expect_error(const std::string& src, int line, const std::string& fragment, const ojson& ctx = ojson::object()) {
  SCOPED_TRACE(src);
  Error e = render_error(src, ctx);
  EXPECT_NE(e.message.find("line " + std::to_string(line) + ":"), std::string::npos) << e.message;
  EXPECT_NE(e.message.find(fragment), std::string::npos) << e.message;
}

TEST(ChatTemplateErrors, RaiseExceptionCarriesMessageAndLine) {
  expect_error("line one\n\n{{ raise_exception('Conversation roles must alternate') }}", 3,
               "Conversation roles must alternate");
  expect_error("{% for m in messages %}\n{% if m.role == 'tool' %}\n{{ raise_exception('no tools: ' ~ m.role) }}{% endif %}{% endfor %}",
               3, "no tools: tool", ojson::parse(R"({"messages": [{"role": "user"}, {"role": "tool"}]})"));
}

TEST(ChatTemplateErrors, SyntaxErrorsAtParseTime) {
  auto check = [](const std::string& src, int line, const std::string& fragment) {
    SCOPED_TRACE(src);
    auto t = ChatTemplate::parse(src);
    ASSERT_FALSE(t.ok());
    EXPECT_NE(t.error().message.find("line " + std::to_string(line) + ":"), std::string::npos) << t.error().message;
    EXPECT_NE(t.error().message.find(fragment), std::string::npos) << t.error().message;
  };
  check("ok\n{% if %}x{% endif %}", 2, "expected an expression");
  check("{% for x in xs %}\nbody\n", 2, "endfor");  // the final newline is dropped, as in jinja2
  check("a\nb\n{{ 'abc' }", 3, "unexpected '}'");
  check("{{ xs | nosuchfilter }}", 1, "no filter named 'nosuchfilter'");
  check("\n{% if x is nosuchtest %}{% endif %}", 2, "no test named 'nosuchtest'");
  check("{% break %}", 1, "outside a loop");
  check("{% do xs.append(1) %}", 1, "unknown tag 'do'");
  check("{# never closed", 1, "comment");
  check("{% raw %}never closed", 1, "raw");
  check("{{ 'unterminated }}", 1, "string");
  check("{% if true %}{% endfor %}", 1, "");
  check("{% macro m(a %}{% endmacro %}", 1, "");
}

TEST(ChatTemplateErrors, UnknownFilterInsideUntakenBranchStillFails) {
  // jinja2 resolves filters when it compiles, so a typo fails even where it never runs.
  auto t = ChatTemplate::parse("{% if false %}{{ x | tojsn }}{% endif %}");
  EXPECT_FALSE(t.ok());
}

TEST(ChatTemplateErrors, RuntimeTypeErrors) {
  expect_error("a\n{{ 1 + 'a' }}", 2, "unsupported operand type(s) for +: 'int' and 'str'");
  expect_error("{{ 'a' + 1 }}", 1, "can only concatenate str");
  expect_error("\n\n\n{{ 1 / 0 }}", 4, "division by zero");
  expect_error("{{ 3 // 0 }}", 1, "ZeroDivisionError");
  expect_error("{{ -xs|length }}", 1, "bad operand type for unary -", ojson::parse(R"({"xs": [1]})"));
  expect_error("{{ 1 < 'a' }}", 1, "'<' not supported");
  expect_error("{{ xs[1:2:0] }}", 1, "slice step cannot be zero", ojson::parse(R"({"xs": [1]})"));
  expect_error("{% for a, b in xs %}{% endfor %}", 1, "unpack", ojson::parse(R"({"xs": [1]})"));
  expect_error("{% for x in 5 %}{% endfor %}", 1, "'int' object is not iterable");
  expect_error("{{ 'x'() }}", 1, "'str' object is not callable");
  expect_error("{{ 'a,b'.split('') }}", 1, "empty separator");
}

TEST(ChatTemplateErrors, UndefinedIsSilentUntilUsed) {
  // Printing, testing and iterating an undefined value are fine ...
  auto t = ChatTemplate::parse("[{{ missing }}]{{ missing is defined }}{% for x in missing %}x{% endfor %}{{ missing|length }}");
  ASSERT_TRUE(t.ok());
  auto out = t->render_ordered(ojson::object());
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  EXPECT_EQ(*out, "[]False0");
  // ... but attribute access, arithmetic and calls on it raise.
  expect_error("{{ missing.role }}", 1, "'missing' is undefined");
  expect_error("\n{{ missing + 1 }}", 2, "'missing' is undefined");
  expect_error("{{ nosuchfunction() }}", 1, "'nosuchfunction' is undefined");
  expect_error("{{ messages[0].role }}", 1, "has no element 0", ojson::parse(R"({"messages": []})"));
  expect_error("{{ d.a.b.c }}", 1, "'int object' has no attribute 'b'", ojson::parse(R"({"d": {"a": 1}})"));
}

TEST(ChatTemplateErrors, SandboxRefusesMutation) {
  ojson ctx = ojson::parse(R"({"xs": [1], "d": {"a": 1}})");
  expect_error("{{ xs.append(2) }}", 1, "SecurityError", ctx);
  expect_error("{{ d.update({'b': 2}) }}", 1, "SecurityError", ctx);
  expect_error("{{ d.pop('a') }}", 1, "SecurityError", ctx);
  expect_error("{% set n = 1 %}\n{% set n.attr = 2 %}", 2, "non-namespace");
}

TEST(ChatTemplateErrors, MacroErrorsNameTheLineInsideTheMacro) {
  expect_error("{% macro m() %}\n\n{{ 1 / 0 }}{% endmacro %}\n{{ m() }}", 3, "division by zero");
  expect_error("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(1, 2) }}", 1, "takes not more than 1 argument");
  expect_error("{% macro m(a) %}{{ a }}{% endmacro %}{{ m(b=2) }}", 1, "no keyword argument 'b'");
}

TEST(ChatTemplateErrors, RunawayTemplatesAreBounded) {
  expect_error("{% macro m(n) %}{{ m(n) }}{% endmacro %}{{ m(1) }}", 1, "RecursionError");
  expect_error("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", 1, "loop iterations");
  expect_error("{{ range(1000000)|length }}", 1, "Range too big");
  expect_error("{{ 'x' * 100000000000 }}", 1, "too large");
  expect_error("{% set ns = namespace() %}{% set ns.self = ns %}{{ ns }}", 1, "recursion");
  expect_error("{% set ns = namespace(v=[]) %}{% for i in range(5000) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v }}", 1,
               "recursion");
  // Deep nesting in the source fails at parse time instead of overflowing the stack.
  std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  EXPECT_FALSE(ChatTemplate::parse(deep).ok());
  std::string deep_ifs;
  for (int i = 0; i < 1000; ++i) deep_ifs += "{% if true %}";
  for (int i = 0; i < 1000; ++i) deep_ifs += "{% endif %}";
  EXPECT_FALSE(ChatTemplate::parse(deep_ifs).ok());
  EXPECT_FALSE(ChatTemplate::parse("{{ " + std::string(10000, '-') + "1 }}").ok());
}

TEST(ChatTemplateErrors, ContextMustBeAnObject) {
  auto t = ChatTemplate::parse("x");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE(t->render_ordered(ojson::array()).ok());
  EXPECT_FALSE(t->render(nlohmann::json("text")).ok());
  // Context nested past the interpreter's depth bound is refused, not a stack overflow.
  ojson deep = ojson::array();
  for (int i = 0; i < 2000; ++i) deep = ojson::array({deep});
  EXPECT_FALSE(t->render_ordered(ojson{{"x", deep}}).ok());
}

TEST(ChatTemplateApi, RenderKeepsOrderedKeysAndSortsPlainJson) {
  auto t = ChatTemplate::parse("{{ tool | tojson }}");
  ASSERT_TRUE(t.ok());
  auto ordered = t->render_ordered(ojson::parse(R"({"tool": {"type": "function", "name": "f"}})"));
  ASSERT_TRUE(ordered.ok());
  EXPECT_EQ(*ordered, R"({"type": "function", "name": "f"})");
  auto sorted = t->render(nlohmann::json::parse(R"({"tool": {"type": "function", "name": "f"}})"));
  ASSERT_TRUE(sorted.ok());
  EXPECT_EQ(*sorted, R"({"name": "f", "type": "function"})");
}

TEST(ChatTemplateApi, StrftimeNowFormatsTheCurrentDate) {
  auto t = ChatTemplate::parse("{{ strftime_now('%Y') }}|{{ strftime_now('%d %b %Y')|length }}");
  ASSERT_TRUE(t.ok());
  auto out = t->render_ordered(ojson::object());
  ASSERT_TRUE(out.ok()) << out.error().to_string();
  ASSERT_EQ(out->size(), 7u) << *out;  // "2025|11": a four-digit year, and "29 Nov 2025" is 11 characters
  EXPECT_EQ(out->substr(4), "|11");
  int year = std::stoi(out->substr(0, 4));
  EXPECT_GE(year, 2024);
}

TEST(ChatTemplateApi, SpecialTokenText) {
  EXPECT_EQ(special_token_text(ojson("<s>")), "<s>");
  EXPECT_EQ(special_token_text(ojson::parse(R"({"__type": "AddedToken", "content": "<bos>", "lstrip": false})")), "<bos>");
  EXPECT_EQ(special_token_text(ojson()), "");
}

TEST(ChatTemplateApi, MovedTemplateStillRenders) {
  auto t = ChatTemplate::parse("{% for m in messages %}{{ m }}{% endfor %}");
  ASSERT_TRUE(t.ok());
  ChatTemplate moved = std::move(*t);
  auto out = moved.render_ordered(ojson::parse(R"({"messages": ["a", "b"]})"));
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, "ab");
}

}  // namespace
}  // namespace strata::tokenizer
