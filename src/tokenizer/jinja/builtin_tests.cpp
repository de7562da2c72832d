// The tests of jinja2 (`x is defined`, `x is string`, `n is divisibleby 3`, ...).
#include <unordered_map>
#include <functional>

#include "tokenizer/jinja/args.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/failure.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/text.h"

namespace strata::tokenizer::jinja {

namespace {

using TestFn = std::function<bool(const Value&, const CallArgs&)>;

bool no_args(const char* name, const CallArgs& c, bool result) {
  ArgBinder a(c, name, {});
  return result;
}

const Value& other(const char* name, const CallArgs& c) {
  if (c.positional.size() + c.keyword.size() != 1) fail(std::string(name) + "() takes exactly one argument");
  return c.positional.empty() ? c.keyword[0].second : c.positional[0];
}

int64_t int_for_parity(const Value& v) {
  if (v.is_undefined()) fail_undefined(v);
  if (v.is_int() || v.is_bool()) return v.as_int();
  if (v.is_float()) return static_cast<int64_t>(v.as_float());
  fail("TypeError: not all arguments converted during string formatting");
}

bool same_case(const Value& v, bool upper) {
  if (!v.is_string()) fail("AttributeError: '" + v.type_name() + "' object has no attribute '" + (upper ? "isupper" : "islower") + "'");
  const std::string& s = v.as_string();
  bool cased = false;
  for (uint32_t cp : decode_utf8(s)) {
    std::string ch;
    append_utf8(ch, cp);
    std::string up = py_upper(ch), lo = py_lower(ch);
    if (up == lo) continue;
    cased = true;
    if (upper ? ch != up : ch != lo) return false;
  }
  return cased;
}

const std::unordered_map<std::string, TestFn>& tests() {
  static const std::unordered_map<std::string, TestFn> kTests = [] {
    std::unordered_map<std::string, TestFn> t;
    t["defined"] = [](const Value& v, const CallArgs& c) { return no_args("defined", c, !v.is_undefined()); };
    t["undefined"] = [](const Value& v, const CallArgs& c) { return no_args("undefined", c, v.is_undefined()); };
    t["none"] = [](const Value& v, const CallArgs& c) { return no_args("none", c, v.is_none()); };
    t["string"] = [](const Value& v, const CallArgs& c) { return no_args("string", c, v.is_string()); };
    t["mapping"] = [](const Value& v, const CallArgs& c) { return no_args("mapping", c, v.is_dict()); };
    t["iterable"] = [](const Value& v, const CallArgs& c) {
      return no_args("iterable", c, v.is_undefined() || v.is_string() || v.is_list() || v.is_dict());
    };
    t["sequence"] = [](const Value& v, const CallArgs& c) {
      return no_args("sequence", c, v.is_undefined() || v.is_string() || v.is_list() || v.is_dict());
    };
    t["number"] = [](const Value& v, const CallArgs& c) { return no_args("number", c, v.is_number()); };
    t["integer"] = [](const Value& v, const CallArgs& c) { return no_args("integer", c, v.is_int()); };
    t["float"] = [](const Value& v, const CallArgs& c) { return no_args("float", c, v.is_float()); };
    t["boolean"] = [](const Value& v, const CallArgs& c) { return no_args("boolean", c, v.is_bool()); };
    t["true"] = [](const Value& v, const CallArgs& c) { return no_args("true", c, v.is_bool() && v.as_bool()); };
    t["false"] = [](const Value& v, const CallArgs& c) { return no_args("false", c, v.is_bool() && !v.as_bool()); };
    t["callable"] = [](const Value& v, const CallArgs& c) { return no_args("callable", c, v.is_callable() || v.is_undefined()); };
    t["odd"] = [](const Value& v, const CallArgs& c) { return no_args("odd", c, (int_for_parity(v) % 2 + 2) % 2 == 1); };
    t["even"] = [](const Value& v, const CallArgs& c) { return no_args("even", c, int_for_parity(v) % 2 == 0); };
    t["divisibleby"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "divisibleby", {"num"});
      Value r = binary_op(BinaryOp::kMod, v, a.require(0, "num"));
      return values_equal(r, Value(int64_t{0}));
    };
    t["lower"] = [](const Value& v, const CallArgs& c) { return no_args("lower", c, same_case(v, false)); };
    t["upper"] = [](const Value& v, const CallArgs& c) { return no_args("upper", c, same_case(v, true)); };
    t["escaped"] = [](const Value& v, const CallArgs& c) { return no_args("escaped", c, false); };
    t["filter"] = [](const Value& v, const CallArgs& c) { return no_args("filter", c, v.is_string() && is_known_filter(v.as_string())); };
    t["test"] = [](const Value& v, const CallArgs& c) { return no_args("test", c, v.is_string() && is_known_test(v.as_string())); };
    t["sameas"] = [](const Value& v, const CallArgs& c) {
      const Value& o = other("sameas", c);
      if (v.kind() != o.kind()) return false;
      switch (v.kind()) {
        case Value::Kind::kList: return &v.as_list() == &o.as_list();
        case Value::Kind::kDict: return &v.as_dict() == &o.as_dict();
        default: return values_equal(v, o);
      }
    };
    auto cmp = [](CompareOp op, const char* name) {
      return [op, name](const Value& v, const CallArgs& c) { return compare_op(op, v, other(name, c)); };
    };
    for (const char* n : {"eq", "equalto", "=="}) t[n] = cmp(CompareOp::kEq, n);
    for (const char* n : {"ne", "!="}) t[n] = cmp(CompareOp::kNe, n);
    for (const char* n : {"lt", "lessthan", "<"}) t[n] = cmp(CompareOp::kLt, n);
    for (const char* n : {"le", "<="}) t[n] = cmp(CompareOp::kLe, n);
    for (const char* n : {"gt", "greaterthan", ">"}) t[n] = cmp(CompareOp::kGt, n);
    for (const char* n : {"ge", ">="}) t[n] = cmp(CompareOp::kGe, n);
    t["in"] = [](const Value& v, const CallArgs& c) { return contains(other("in", c), v); };
    return t;
  }();
  return kTests;
}

}  // namespace

bool is_known_test(const std::string& name) { return tests().count(name) != 0; }

bool apply_test(const std::string& name, const Value& value, const CallArgs& args) {
  auto it = tests().find(name);
  if (it == tests().end()) fail("TemplateAssertionError: No test named '" + name + "'.");
  return it->second(value, args);
}

}  // namespace strata::tokenizer::jinja
