#include "sampling/grammar/json_schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <optional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "sampling/grammar/regex.h"

namespace strata::grammar {

namespace {

using json = nlohmann::ordered_json;

struct SchemaError {
  ErrorCode code;
  std::string message;
};

[[noreturn]] void fail(ErrorCode code, const std::string& msg) { throw SchemaError{code, "json_schema: " + msg}; }
[[noreturn]] void unsupported(const std::string& msg) { fail(ErrorCode::kUnsupported, msg); }
[[noreturn]] void invalid(const std::string& msg) { fail(ErrorCode::kInvalidArgument, msg); }

std::string at(const std::string& path) { return path.empty() ? "at the root" : "at '" + path + "'"; }

const std::set<std::string>& annotation_keywords() {
  static const std::set<std::string> k = {"title", "description", "default", "examples", "$schema", "$id", "id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$anchor",
                                          "contentMediaType", "contentEncoding", "$defs", "definitions"};
  return k;
}
const std::set<std::string>& supported_keywords() {
  static const std::set<std::string> k = {
      "type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref", "properties", "required",
      "additionalProperties", "items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
      "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
      "exclusiveMaximum", "multipleOf", "nullable"};
  return k;
}

// A full-date of RFC 3339 that exists: years 0001-9999, each month's own day count, February
// 29 only in leap years (divisible by 4, centuries only by 400).
std::string full_date() {
  const std::string year = R"((\d{3}[1-9]|\d{2}[1-9]\d|\d[1-9]\d{2}|[1-9]\d{3}))";
  const std::string leap = R"((\d\d(0[48]|[2468][048]|[13579][26])|(0[48]|[2468][048]|[13579][26])00))";
  return "(" + year + R"(-(0[13578]|1[02])-(0[1-9]|[12]\d|3[01])|)" + year + R"(-(0[469]|11)-(0[1-9]|[12]\d|30)|)" + year +
         R"(-02-(0[1-9]|1\d|2[0-8])|)" + leap + "-02-29)";
}

const std::map<std::string, std::string>& string_formats() {
  static const std::map<std::string, std::string> f = {
      {"date", full_date()},
      {"time", R"(([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d))"},
      {"date-time",
       full_date() + R"([Tt]([01]\d|2[0-3]):[0-5]\d:([0-5]\d|60)(\.\d+)?([Zz]|[+-]([01]\d|2[0-3]):[0-5]\d))"},
      {"email",
       R"([A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+(\.[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+)*@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)+)"},
      {"uuid", R"([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})"},
      {"uri", R"([A-Za-z][A-Za-z0-9+.-]*:[A-Za-z0-9\-._~:/?#\[\]@!$&'()*+,;=%]*)"},
      {"ipv4", R"((25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(\.(25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)){3})"},
  };
  return f;
}

const std::vector<std::string> kAllTypes = {"null", "boolean", "object", "array", "string", "number"};

std::vector<std::string> type_list(const json& t, const std::string& path) {
  std::vector<std::string> out;
  auto add = [&](const json& v) {
    static const std::set<std::string> known = {"null", "boolean", "object", "array", "string", "number", "integer"};
    if (!v.is_string() || !known.count(v.get<std::string>()))
      invalid("type " + at(path) + ": unknown type " + v.dump());
    out.push_back(v.get<std::string>());
  };
  if (t.is_array()) {
    for (const auto& v : t) add(v);
  } else {
    add(t);
  }
  return out;
}

// The JSON type names a value satisfies.
bool value_has_type(const json& v, const std::string& t) {
  if (t == "null") return v.is_null();
  if (t == "boolean") return v.is_boolean();
  if (t == "object") return v.is_object();
  if (t == "array") return v.is_array();
  if (t == "string") return v.is_string();
  if (t == "number") return v.is_number();
  if (t == "integer") return v.is_number_integer() || (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
  return false;
}

// Integers as decimal digit strings; lengths in [1, 19].
std::string all_digit(size_t n, char c) { return std::string(n, c); }

class SchemaCompiler {
 public:
  SchemaCompiler(GrammarBuilder& b, const json& root, const JsonSchemaOptions& o) : b_(b), root_(root), o_(o) {}

  ExprId compile(const json& s, const std::string& path, int depth) {
    if (depth > b_.limits().max_depth) fail(ErrorCode::kResourceExhausted, "schema nested deeper than " + std::to_string(b_.limits().max_depth) + " " + at(path));
    if (auto st = b_.check_budget(); !st.ok()) fail(st.error().code, st.error().message);
    if (s.is_boolean()) return s.get<bool>() ? any_value() : b_.nothing();
    if (!s.is_object()) invalid("schema " + at(path) + " must be an object or a boolean, not " + s.dump());
    bool has_assertions = false;
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (annotation_keywords().count(it.key())) continue;
      if (!supported_keywords().count(it.key())) unsupported("keyword '" + it.key() + "' " + at(path) + " is not supported");
      has_assertions = true;
    }
    if (!has_assertions) return any_value();
    if (s.contains("allOf")) {
      const json merged = merge_all_of(s, path, 0);
      return compile(merged, path + "/allOf", depth + 1);
    }
    if (s.contains("$ref")) {
      if (!s["$ref"].is_string()) invalid("$ref " + at(path) + " must be a string");
      const std::string ref = s["$ref"].get<std::string>();
      if (siblings(s, {"$ref"}).empty()) return ref_expr(ref, depth);
      // 2020-12: $ref beside other keywords applies both.
      json merged = merge(resolve(ref, path), siblings(s, {"$ref"}), path, 0);
      return compile(merged, path, depth + 1);
    }
    if (s.contains("anyOf") || s.contains("oneOf")) {
      if (s.contains("anyOf") && s.contains("oneOf")) unsupported("anyOf together with oneOf " + at(path));
      const char* kw = s.contains("anyOf") ? "anyOf" : "oneOf";
      const json& branches = s[kw];
      if (!branches.is_array() || branches.empty()) invalid(std::string(kw) + " " + at(path) + " must be a non-empty array");
      json rest = siblings(s, {kw});
      std::vector<ExprId> alts;
      for (size_t i = 0; i < branches.size(); ++i) {
        const std::string bp = path + "/" + kw + "/" + std::to_string(i);
        if (rest.empty()) alts.push_back(compile(branches[i], bp, depth + 1));
        else alts.push_back(compile(merge(rest, branches[i], bp, 0), bp, depth + 1));
      }
      return b_.alt(std::move(alts));
    }
    std::vector<std::string> types = s.contains("type") ? type_list(s["type"], path + "/type") : kAllTypes;
    if (s.contains("type") && types.empty()) invalid("type " + at(path) + " is an empty list: unsatisfiable");
    if (s.value("nullable", false) && std::find(types.begin(), types.end(), "null") == types.end()) types.push_back("null");
    if (s.contains("const") || s.contains("enum")) return enum_expr(s, types, path);
    const bool has_number = std::find(types.begin(), types.end(), "number") != types.end();
    std::vector<ExprId> alts;
    std::set<std::string> done;
    for (const auto& t : types) {
      if ((t == "integer" && has_number) || !done.insert(t).second) continue;
      alts.push_back(type_expr(s, t, path, depth));
    }
    return b_.alt(std::move(alts));
  }

  ExprId any_value() {
    if (value_rule_ < 0) {
      value_rule_ = b_.add_rule("json_value");
      const RuleId obj = b_.add_rule("json_object"), arr = b_.add_rule("json_array");
      const ExprId v = b_.ref(value_rule_);
      const ExprId pair = b_.seq({string_any(), kv_sep(), v});
      b_.set_rule(obj, b_.seq({b_.literal("{"), ws(), b_.opt(b_.seq({pair, b_.star(b_.seq({item_sep(), pair}))})), ws(), b_.literal("}")}));
      b_.set_rule(arr, b_.seq({b_.literal("["), ws(), b_.opt(b_.seq({v, b_.star(b_.seq({item_sep(), v}))})), ws(), b_.literal("]")}));
      b_.set_rule(value_rule_, b_.alt({b_.ref(obj), b_.ref(arr), string_any(), number_any(), b_.literal("true"),
                                       b_.literal("false"), b_.literal("null")}));
      object_rule_ = obj;
    }
    return b_.ref(value_rule_);
  }
  ExprId any_object() {
    any_value();
    return b_.ref(object_rule_);
  }

 private:
  ExprId ws() {
    if (o_.whitespace == JsonWhitespace::kCompact) return b_.empty();
    ByteSet s;
    for (char c : std::string_view(" \t\n\r")) s.add(uint8_t(c));
    return b_.star(b_.bytes(s));
  }
  ExprId item_sep() { return b_.seq({ws(), b_.literal(","), ws()}); }
  ExprId kv_sep() { return b_.seq({ws(), b_.literal(":"), ws()}); }

  ExprId string_any() {
    if (string_rule_ < 0) {
      string_rule_ = b_.add_rule("json_string");
      b_.set_rule(string_rule_, b_.seq({b_.literal("\""), b_.star(json_string_char(b_)), b_.literal("\"")}));
    }
    return b_.ref(string_rule_);
  }
  ExprId digits(int min) {
    ByteSet d;
    d.add_range('0', '9');
    return b_.repeat(b_.bytes(d), min, -1);
  }
  ExprId nat_any() {  // 0 | [1-9][0-9]*
    return b_.alt({b_.literal("0"), b_.seq({b_.byte_range('1', '9'), digits(0)})});
  }
  ExprId number_any() {
    if (number_rule_ < 0) {
      number_rule_ = b_.add_rule("json_number");
      ByteSet e, sign;
      e.add('e');
      e.add('E');
      sign.add('+');
      sign.add('-');
      b_.set_rule(number_rule_, b_.seq({b_.opt(b_.literal("-")), nat_any(), b_.opt(b_.seq({b_.literal("."), digits(1)})),
                                        b_.opt(b_.seq({b_.bytes(e), b_.opt(b_.bytes(sign)), digits(1)}))}));
    }
    return b_.ref(number_rule_);
  }

  json siblings(const json& s, std::initializer_list<const char*> drop) {
    json out = json::object();
    for (auto it = s.begin(); it != s.end(); ++it) {
      if (annotation_keywords().count(it.key())) continue;
      bool skip = false;
      for (const char* d : drop) skip |= it.key() == d;
      if (!skip) out[it.key()] = it.value();
    }
    return out;
  }

  const json& resolve(const std::string& ref, const std::string& path) {
    if (ref.empty() || ref[0] != '#')
      unsupported("$ref '" + ref + "' " + at(path) + ": only local references ('#...') are supported");
    if (ref == "#") return root_;
    if (ref.size() < 2 || ref[1] != '/') unsupported("$ref '" + ref + "' " + at(path) + ": anchors are not supported");
    const json* cur = &root_;
    size_t i = 2;
    while (i <= ref.size()) {
      size_t j = ref.find('/', i);
      if (j == std::string::npos) j = ref.size();
      std::string tok;
      for (size_t k = i; k < j; ++k) {
        if (ref[k] == '~' && k + 1 < j) {
          tok += ref[k + 1] == '1' ? '/' : '~';
          ++k;
        } else if (ref[k] == '%' && k + 2 < j && isxdigit(static_cast<unsigned char>(ref[k + 1])) && isxdigit(static_cast<unsigned char>(ref[k + 2]))) {
          tok += static_cast<char>(std::stoi(ref.substr(k + 1, 2), nullptr, 16));
          k += 2;
        } else {
          tok += ref[k];
        }
      }
      if (cur->is_object() && cur->contains(tok)) {
        cur = &(*cur)[tok];
      } else if (cur->is_array() && !tok.empty() && std::all_of(tok.begin(), tok.end(), ::isdigit) && std::stoul(tok) < cur->size()) {
        cur = &(*cur)[std::stoul(tok)];
      } else {
        invalid("$ref '" + ref + "' " + at(path) + " does not resolve");
      }
      i = j + 1;
    }
    return *cur;
  }

  ExprId ref_expr(const std::string& ref, int depth) {
    auto it = ref_rules_.find(ref);
    if (it != ref_rules_.end()) return b_.ref(it->second);
    const json& target = resolve(ref, ref);
    const RuleId r = b_.add_rule("ref " + ref);
    ref_rules_[ref] = r;
    b_.set_rule(r, compile(target, ref, depth + 1));
    return b_.ref(r);
  }

  // allOf folded into one schema; refs inside are expanded (a bounded number of times).
  json merge_all_of(const json& s, const std::string& path, int depth) {
    const json& parts = s["allOf"];
    if (!parts.is_array() || parts.empty()) invalid("allOf " + at(path) + " must be a non-empty array");
    json acc = siblings(s, {"allOf"});
    for (size_t i = 0; i < parts.size(); ++i) acc = merge(acc, parts[i], path + "/allOf/" + std::to_string(i), depth);
    return acc;
  }

  json expand(const json& s, const std::string& path, int depth) {
    if (depth > 16) unsupported("allOf " + at(path) + ": cannot merge through recursive $ref");
    if (!s.is_object()) return s;
    if (s.contains("allOf")) return merge_all_of(s, path, depth + 1);
    if (s.contains("$ref") && s["$ref"].is_string()) {
      const json& target = resolve(s["$ref"].get<std::string>(), path);
      return merge(expand(target, path, depth + 1), siblings(s, {"$ref"}), path, depth + 1);
    }
    return s;
  }

  json merge(const json& a0, const json& b0, const std::string& path, int depth) {
    json a = expand(a0, path, depth), b = expand(b0, path, depth);
    if (a.is_boolean()) return a.get<bool>() ? b : a;
    if (b.is_boolean()) return b.get<bool>() ? a : b;
    if (!a.is_object() || !b.is_object()) invalid("schema " + at(path) + " must be an object or a boolean");
    for (const json* x : {&a, &b})
      for (auto it = x->begin(); it != x->end(); ++it)
        if (!annotation_keywords().count(it.key()) && !supported_keywords().count(it.key()))
          unsupported("keyword '" + it.key() + "' " + at(path) + " is not supported");
    for (json* x : {&a, &b})
      if (x->contains("const")) {
        (*x)["enum"] = json::array({(*x)["const"]});
        x->erase("const");
      }
    auto props_outside = [](const json& x, const json& y) {  // y declares properties x does not
      if (!y.contains("properties")) return false;
      for (auto it = y["properties"].begin(); it != y["properties"].end(); ++it)
        if (!x.contains("properties") || !x["properties"].contains(it.key())) return true;
      return false;
    };
    for (auto [x, y] : {std::pair<const json*, const json*>{&a, &b}, {&b, &a}})
      if (x->contains("additionalProperties") && (*x)["additionalProperties"] != json(true) && props_outside(*x, *y))
        unsupported("allOf " + at(path) + ": cannot merge additionalProperties with properties declared elsewhere");
    json r = a;
    for (auto it = b.begin(); it != b.end(); ++it) {
      const std::string& k = it.key();
      const json& v = it.value();
      if (annotation_keywords().count(k)) continue;
      if (!r.contains(k)) {
        r[k] = v;
        continue;
      }
      json& cur = r[k];
      if (k == "type") {
        auto ta = type_list(cur, path), tb = type_list(v, path);
        json out = json::array();
        for (const auto& x : ta)
          for (const auto& y : tb) {
            std::string t = x == y ? x : (x == "integer" && y == "number") || (x == "number" && y == "integer") ? "integer" : "";
            if (!t.empty() && std::find(out.begin(), out.end(), json(t)) == out.end()) out.push_back(t);
          }
        if (out.empty()) invalid("allOf " + at(path) + ": types " + cur.dump() + " and " + v.dump() + " have no common type (unsatisfiable)");
        cur = out;
      } else if (k == "required") {
        for (const auto& x : v)
          if (std::find(cur.begin(), cur.end(), x) == cur.end()) cur.push_back(x);
      } else if (k == "properties") {
        for (auto p = v.begin(); p != v.end(); ++p) {
          if (cur.contains(p.key())) cur[p.key()] = json{{"allOf", json::array({cur[p.key()], p.value()})}};
          else cur[p.key()] = p.value();
        }
      } else if (k == "minimum" || k == "exclusiveMinimum" || k == "minLength" || k == "minItems") {
        if (v.is_number() && cur.is_number() && v.get<double>() > cur.get<double>()) cur = v;
      } else if (k == "maximum" || k == "exclusiveMaximum" || k == "maxLength" || k == "maxItems") {
        if (v.is_number() && cur.is_number() && v.get<double>() < cur.get<double>()) cur = v;
      } else if (k == "enum") {
        json out = json::array();
        for (const auto& x : cur)
          if (std::find(v.begin(), v.end(), x) != v.end()) out.push_back(x);
        if (out.empty()) invalid("allOf " + at(path) + ": enum/const values have no common value (unsatisfiable)");
        cur = out;
      } else if ((k == "items" && v.is_object() && cur.is_object()) || k == "additionalProperties") {
        if (v == json(false) || cur == json(false)) cur = false;
        else if (v != cur) cur = json{{"allOf", json::array({cur, v})}};
      } else if (k == "uniqueItems") {
        cur = cur.get<bool>() || v.get<bool>();
      } else if (k == "nullable") {
        cur = cur.get<bool>() && v.get<bool>();
      } else if (cur != v) {
        unsupported("allOf " + at(path) + ": cannot merge two different '" + k + "'");
      }
    }
    return r;
  }

  ExprId enum_expr(const json& s, const std::vector<std::string>& types, const std::string& path) {
    json values = json::array();
    if (s.contains("enum")) {
      if (!s["enum"].is_array()) invalid("enum " + at(path) + " must be an array");
      if (s["enum"].empty()) invalid("enum " + at(path) + " is empty: unsatisfiable");
      values = s["enum"];
    }
    if (s.contains("const")) {
      const bool in_enum = !s.contains("enum") || std::find(values.begin(), values.end(), s["const"]) != values.end();
      values = in_enum ? json::array({s["const"]}) : json::array();
    }
    std::vector<ExprId> alts;
    for (const auto& v : values) {
      bool ok = false;
      for (const auto& t : types) ok |= value_has_type(v, t) || (t == "number" && v.is_number());
      if (ok) alts.push_back(b_.literal(v.dump()));
    }
    if (alts.empty()) invalid("enum/const " + at(path) + " has no value of the allowed types: unsatisfiable");
    return b_.alt(std::move(alts));
  }

  ExprId type_expr(const json& s, const std::string& t, const std::string& path, int depth) {
    if (t == "null") return b_.literal("null");
    if (t == "boolean") return b_.alt({b_.literal("true"), b_.literal("false")});
    if (t == "string") return string_expr(s, path);
    if (t == "integer") return integer_expr(s, path);
    if (t == "number") return number_expr(s, path);
    if (t == "object") return object_expr(s, path, depth);
    return array_expr(s, path, depth);
  }

  std::optional<int64_t> count_kw(const json& s, const char* k, const std::string& path) {
    if (!s.contains(k)) return std::nullopt;
    const json& v = s[k];
    if (!v.is_number() || v.get<double>() < 0 || std::floor(v.get<double>()) != v.get<double>())
      invalid(std::string(k) + " " + at(path) + " must be a non-negative integer, not " + v.dump());
    return static_cast<int64_t>(std::min(v.get<double>(), 1e12));
  }

  ExprId string_expr(const json& s, const std::string& path) {
    const auto min_len = count_kw(s, "minLength", path), max_len = count_kw(s, "maxLength", path);
    const bool has_len = min_len || max_len;
    if (min_len && max_len && *min_len > *max_len)
      invalid("minLength " + std::to_string(*min_len) + " > maxLength " + std::to_string(*max_len) + " " + at(path) + ": unsatisfiable");
    if (s.contains("format") && !s["format"].is_string()) invalid("format " + at(path) + " must be a string");
    const std::string format = s.value("format", std::string());
    if (!format.empty() && !string_formats().count(format))
      unsupported("format '" + format + "' " + at(path) + " is not supported (supported: date, time, date-time, email, uuid, uri, ipv4)");
    if (s.contains("pattern")) {
      if (!s["pattern"].is_string()) invalid("pattern " + at(path) + " must be a string");
      if (has_len) unsupported("pattern together with minLength/maxLength " + at(path) + " is not supported");
      if (!format.empty()) unsupported("pattern together with format " + at(path) + " is not supported");
      auto e = regex_to_expr(b_, s["pattern"].get<std::string>(), RegexMode{true, true});
      if (!e.ok()) fail(e.error().code, "pattern " + at(path) + ": " + e.error().message);
      return b_.seq({b_.literal("\""), *e, b_.literal("\"")});
    }
    if (!format.empty()) {
      if (has_len) unsupported("format together with minLength/maxLength " + at(path) + " is not supported");
      auto e = regex_to_expr(b_, string_formats().at(format), RegexMode{true, false});
      if (!e.ok()) fail(ErrorCode::kInternal, e.error().message);
      return b_.seq({b_.literal("\""), *e, b_.literal("\"")});
    }
    if (!has_len) return string_any();
    const int64_t lo = min_len.value_or(0), hi = max_len ? *max_len : -1;
    if (std::max(lo, hi) > b_.limits().max_repeat)
      fail(ErrorCode::kResourceExhausted, "minLength/maxLength " + at(path) + " past the limit of " + std::to_string(b_.limits().max_repeat));
    return b_.seq({b_.literal("\""), b_.repeat(json_string_char(b_), static_cast<int>(lo), static_cast<int>(hi)), b_.literal("\"")});
  }

  // Decimal digits of the naturals in [a, z], both of length n (leading zeros allowed here).
  ExprId same_len(const std::string& a, const std::string& z) {
    if (a.empty()) return b_.empty();
    const std::string ra = a.substr(1), rz = z.substr(1);
    if (ra == all_digit(ra.size(), '0') && rz == all_digit(rz.size(), '9'))
      return b_.seq({b_.byte_range(uint8_t(a[0]), uint8_t(z[0])), b_.repeat(b_.byte_range('0', '9'), int(ra.size()), int(ra.size()))});
    if (a[0] == z[0]) return b_.seq({b_.literal(a.substr(0, 1)), same_len(ra, rz)});
    std::vector<ExprId> alts{b_.seq({b_.literal(a.substr(0, 1)), same_len(ra, all_digit(ra.size(), '9'))})};
    if (a[0] + 1 <= z[0] - 1)
      alts.push_back(b_.seq({b_.byte_range(uint8_t(a[0] + 1), uint8_t(z[0] - 1)), b_.repeat(b_.byte_range('0', '9'), int(ra.size()), int(ra.size()))}));
    alts.push_back(b_.seq({b_.literal(z.substr(0, 1)), same_len(all_digit(rz.size(), '0'), rz)}));
    return b_.alt(std::move(alts));
  }
  // Naturals in [lo, hi] (hi < 0: unbounded), without leading zeros.
  ExprId nat_range(int64_t lo, int64_t hi) {
    const std::string a = std::to_string(lo);
    const size_t top = hi < 0 ? a.size() : std::to_string(hi).size();
    std::vector<ExprId> alts;
    for (size_t len = a.size(); len <= top; ++len) {
      std::string x = a;
      if (len != a.size()) {  // the smallest number of `len` digits
        x.assign(len, '0');
        x[0] = '1';
      }
      const std::string z = (hi >= 0 && len == top) ? std::to_string(hi) : all_digit(len, '9');
      alts.push_back(same_len(x, z));
    }
    if (hi < 0) alts.push_back(b_.seq({b_.byte_range('1', '9'), digits(static_cast<int>(a.size()))}));
    return b_.alt(std::move(alts));
  }

  ExprId integer_expr(const json& s, const std::string& path) {
    constexpr double kMaxAbs = 1e18;
    std::optional<int64_t> lo, hi;
    auto bound = [&](const char* k, bool upper, bool exclusive) {
      if (!s.contains(k)) return;
      const json& v = s[k];
      if (v.is_boolean()) unsupported(std::string(k) + " as a boolean (draft 4) " + at(path) + " is not supported");
      if (!v.is_number()) invalid(std::string(k) + " " + at(path) + " must be a number");
      const double x = v.get<double>();
      if (std::fabs(x) > kMaxAbs) unsupported(std::string(k) + " " + v.dump() + " " + at(path) + " is past +-1e18");
      int64_t b;
      if (upper) b = exclusive ? static_cast<int64_t>(std::ceil(x)) - 1 : static_cast<int64_t>(std::floor(x));
      else b = exclusive ? static_cast<int64_t>(std::floor(x)) + 1 : static_cast<int64_t>(std::ceil(x));
      if (upper) hi = hi ? std::min(*hi, b) : b;
      else lo = lo ? std::max(*lo, b) : b;
    };
    bound("minimum", false, false);
    bound("exclusiveMinimum", false, true);
    bound("maximum", true, false);
    bound("exclusiveMaximum", true, true);
    const std::string fmt = s.value("format", std::string());
    if (fmt == "int32") {
      lo = std::max<int64_t>(lo.value_or(INT32_MIN), INT32_MIN);
      hi = std::min<int64_t>(hi.value_or(INT32_MAX), INT32_MAX);
    }
    if (lo && hi && *lo > *hi) invalid("integer bounds " + at(path) + " leave no value: unsatisfiable");
    if (s.contains("multipleOf")) {
      const json& m = s["multipleOf"];
      if (!m.is_number() || m.get<double>() <= 0) invalid("multipleOf " + at(path) + " must be a positive number");
      const double k = m.get<double>();
      if (std::floor(k) != k) unsupported("multipleOf " + m.dump() + " " + at(path) + ": only integer divisors are supported");
      const int64_t d = static_cast<int64_t>(k);
      if (d > 1) {
        if (lo && hi) {
          std::vector<ExprId> alts;
          int64_t first = (*lo % d == 0) ? *lo : *lo + ((d - (*lo % d)) % d + d) % d;
          if (((*hi - first) / d) > 1024) unsupported("multipleOf with a range of more than 1024 multiples " + at(path) + " is not supported");
          for (int64_t v = first; v <= *hi; v += d) alts.push_back(b_.literal(std::to_string(v)));
          if (alts.empty()) invalid("multipleOf " + at(path) + ": no multiple within the bounds (unsatisfiable)");
          return b_.alt(std::move(alts));
        }
        if (lo || hi) unsupported("multipleOf together with a one-sided bound " + at(path) + " is not supported");
        if (d > 1000) unsupported("multipleOf " + m.dump() + " " + at(path) + " is past 1000");
        return multiple_of(d);
      }
    }
    if (!lo && !hi) return b_.seq({b_.opt(b_.literal("-")), nat_any()});
    std::vector<ExprId> alts;
    // Negative part: -n for naturals n >= 1 with -n in [lo, hi].
    if (!lo || *lo < 0) {
      const int64_t n_lo = (hi && *hi < 0) ? -*hi : 1;
      const int64_t n_hi = lo ? -*lo : -1;
      if (n_hi < 0 || n_lo <= n_hi) alts.push_back(b_.seq({b_.literal("-"), nat_range(n_lo, n_hi)}));
    }
    if (!hi || *hi >= 0) alts.push_back(nat_range(lo ? std::max<int64_t>(0, *lo) : 0, hi ? *hi : -1));
    return b_.alt(std::move(alts));
  }

  // Integers divisible by d: one rule per remainder of the digits read so far.
  ExprId multiple_of(int64_t d) {
    auto it = mod_rules_.find(d);
    if (it == mod_rules_.end()) {
      std::vector<RuleId> rem(d);
      for (int64_t r = 0; r < d; ++r) rem[r] = b_.add_rule("mod" + std::to_string(d) + "_" + std::to_string(r));
      for (int64_t r = 0; r < d; ++r) {
        std::map<int64_t, ByteSet> by_target;
        for (int dig = 0; dig < 10; ++dig) by_target[(r * 10 + dig) % d].add(uint8_t('0' + dig));
        std::vector<ExprId> alts;
        if (r == 0) alts.push_back(b_.empty());
        for (auto& [t, set] : by_target) alts.push_back(b_.seq({b_.bytes(set), b_.ref(rem[t])}));
        b_.set_rule(rem[r], b_.alt(std::move(alts)));
      }
      std::map<int64_t, ByteSet> first;
      for (int dig = 1; dig < 10; ++dig) first[dig % d].add(uint8_t('0' + dig));
      std::vector<ExprId> alts;
      for (auto& [t, set] : first) alts.push_back(b_.seq({b_.bytes(set), b_.ref(rem[t])}));
      const RuleId root = b_.add_rule("multiple_of_" + std::to_string(d));
      b_.set_rule(root, b_.alt({b_.literal("0"), b_.seq({b_.opt(b_.literal("-")), b_.alt(std::move(alts))})}));
      it = mod_rules_.emplace(d, root).first;
    }
    return b_.ref(it->second);
  }

  // Decimal fraction digits r (0.r, possibly empty) between bounds, as (empty r allowed, the
  // non-empty r). Bounds are digit strings without trailing zeros; "" is 0.
  struct RSet {
    bool empty;
    ExprId nonempty;
  };
  ExprId any_digits(int min) { return b_.repeat(b_.byte_range('0', '9'), min, -1); }
  ExprId rset_expr(const RSet& r) { return b_.alt({r.empty ? b_.empty() : b_.nothing(), r.nonempty}); }
  RSet r_ge(const std::string& a, bool incl) {
    if (a.empty()) {
      if (incl) return {true, any_digits(1)};
      return {false, b_.seq({b_.star(b_.literal("0")), b_.byte_range('1', '9'), any_digits(0)})};
    }
    std::vector<ExprId> alts;
    if (a[0] < '9') alts.push_back(b_.seq({b_.byte_range(uint8_t(a[0] + 1), '9'), any_digits(0)}));
    alts.push_back(b_.seq({b_.literal(a.substr(0, 1)), rset_expr(r_ge(a.substr(1), incl))}));
    return {false, b_.alt(std::move(alts))};
  }
  RSet r_le(const std::string& z, bool incl) {
    if (z.empty()) return {incl, incl ? b_.plus(b_.literal("0")) : b_.nothing()};
    std::vector<ExprId> alts;
    if (z[0] > '0') alts.push_back(b_.seq({b_.byte_range('0', uint8_t(z[0] - 1)), any_digits(0)}));
    alts.push_back(b_.seq({b_.literal(z.substr(0, 1)), rset_expr(r_le(z.substr(1), incl))}));
    return {true, b_.alt(std::move(alts))};
  }
  RSet r_between(const std::string& a, bool ia, const std::string& z, bool iz) {
    if (a.empty() && z.empty()) return {ia && iz, (ia && iz) ? b_.plus(b_.literal("0")) : b_.nothing()};
    const char a0 = a.empty() ? '0' : a[0], z0 = z.empty() ? '0' : z[0];
    const std::string ar = a.empty() ? "" : a.substr(1), zr = z.empty() ? "" : z.substr(1);
    const bool empty = a.empty() && ia;  // 0.'' = 0 is below any non-empty upper bound
    if (a0 == z0) return {empty, b_.seq({b_.literal(std::string(1, a0)), rset_expr(r_between(ar, ia, zr, iz))})};
    std::vector<ExprId> alts{b_.seq({b_.literal(std::string(1, a0)), rset_expr(r_ge(ar, ia))})};
    if (a0 + 1 <= z0 - 1) alts.push_back(b_.seq({b_.byte_range(uint8_t(a0 + 1), uint8_t(z0 - 1)), any_digits(0)}));
    alts.push_back(b_.seq({b_.literal(std::string(1, z0)), rset_expr(r_le(zr, iz))}));
    return {empty, b_.alt(std::move(alts))};
  }
  // The fraction part ("" or "." digits) for an r-set.
  ExprId fraction(const RSet& r) { return b_.alt({r.empty ? b_.empty() : b_.nothing(), b_.seq({b_.literal("."), r.nonempty})}); }

  struct Decimal {
    int64_t int_part;
    std::string frac;  // digits, no trailing zeros
  };
  static Decimal decimal_of(double x) {  // x >= 0, below 1e15: the shortest exact-round-trip digits
    char buf[64];
    auto res = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::fixed);
    std::string t(buf, res.ptr);
    const size_t dot = t.find('.');
    Decimal d{std::stoll(t.substr(0, dot)), dot == std::string::npos ? "" : t.substr(dot + 1)};
    while (!d.frac.empty() && d.frac.back() == '0') d.frac.pop_back();
    return d;
  }
  struct Bound {
    double v = 0;
    bool incl = true;
  };
  // Magnitudes (0|[1-9]\d*)(\.\d+)? between optional bounds (both >= 0).
  ExprId magnitude(std::optional<Bound> lo, std::optional<Bound> hi) {
    const ExprId any_frac = b_.opt(b_.seq({b_.literal("."), any_digits(1)}));
    if (!lo && !hi) return b_.seq({nat_any(), any_frac});
    if (lo && !hi) {
      const Decimal a = decimal_of(lo->v);
      return b_.alt({b_.seq({b_.literal(std::to_string(a.int_part)), fraction(r_ge(a.frac, lo->incl))}),
                     b_.seq({nat_range(a.int_part + 1, -1), any_frac})});
    }
    const Decimal z = decimal_of(hi->v);
    const Decimal a = lo ? decimal_of(lo->v) : Decimal{0, ""};
    const bool ia = lo ? lo->incl : true;
    if (a.int_part == z.int_part) return b_.seq({b_.literal(std::to_string(a.int_part)), fraction(r_between(a.frac, ia, z.frac, hi->incl))});
    std::vector<ExprId> alts{b_.seq({b_.literal(std::to_string(a.int_part)), fraction(r_ge(a.frac, ia))})};
    if (a.int_part + 1 <= z.int_part - 1) alts.push_back(b_.seq({nat_range(a.int_part + 1, z.int_part - 1), any_frac}));
    alts.push_back(b_.seq({b_.literal(std::to_string(z.int_part)), fraction(r_le(z.frac, hi->incl))}));
    return b_.alt(std::move(alts));
  }

  // Numbers within minimum/maximum/exclusive*: written without an exponent.
  ExprId number_expr(const json& s, const std::string& path) {
    if (s.contains("multipleOf")) unsupported("multipleOf on type number " + at(path) + " is not supported (only on integer)");
    std::optional<Bound> lo, hi;
    auto bound = [&](const char* k, bool upper, bool exclusive) {
      if (!s.contains(k)) return;
      const json& v = s[k];
      if (v.is_boolean()) unsupported(std::string(k) + " as a boolean (draft 4) " + at(path) + " is not supported");
      if (!v.is_number()) invalid(std::string(k) + " " + at(path) + " must be a number");
      const double x = v.get<double>();
      if (!(std::fabs(x) < 1e15)) unsupported(std::string(k) + " " + v.dump() + " " + at(path) + " is past +-1e15");
      std::optional<Bound>& cur = upper ? hi : lo;
      const Bound b{x, !exclusive};
      if (!cur || (upper ? (b.v < cur->v || (b.v == cur->v && !b.incl)) : (b.v > cur->v || (b.v == cur->v && !b.incl)))) cur = b;
    };
    bound("minimum", false, false);
    bound("exclusiveMinimum", false, true);
    bound("maximum", true, false);
    bound("exclusiveMaximum", true, true);
    if (!lo && !hi) return number_any();
    if (lo && hi && (lo->v > hi->v || (lo->v == hi->v && !(lo->incl && hi->incl))))
      invalid("number bounds " + at(path) + " leave no value: unsatisfiable");
    std::vector<ExprId> alts;
    // x >= 0, written as its magnitude.
    if (!hi || hi->v >= 0) {
      std::optional<Bound> mlo;
      if (lo && lo->v >= 0) mlo = *lo;
      alts.push_back(magnitude(mlo, hi));
    }
    // x = -m.
    if (!lo || lo->v <= 0) {
      std::optional<Bound> mlo, mhi;
      if (hi && hi->v < 0) mlo = Bound{-hi->v, hi->incl};
      if (lo) mhi = Bound{-lo->v, lo->incl};
      alts.push_back(b_.seq({b_.literal("-"), magnitude(mlo, mhi)}));
    }
    return b_.alt(std::move(alts));
  }

  // A rule wrapping e, so repeated uses share one copy.
  ExprId as_rule(ExprId e, const std::string& name) {
    const RuleId r = b_.add_rule(name);
    b_.set_rule(r, e);
    return b_.ref(r);
  }

  // JSON string keys other than `names` (compared on their JSON encodings).
  ExprId key_excluding(const std::vector<std::string>& names) {
    std::vector<std::string> enc;
    for (const auto& n : names) {
      std::string e = json(n).dump();
      enc.push_back(e.substr(1, e.size() - 2));
      if (enc.back().find('\\') != std::string::npos) return string_any();  // escapes: unrestricted
    }
    if (enc.empty()) return string_any();
    struct TrieNode {
      std::map<uint8_t, int> child;
      bool terminal = false;
      int pending = 0;  // continuation bytes left in the current code point
    };
    std::vector<TrieNode> trie(1);
    for (const auto& e : enc) {
      int cur = 0, pending = 0;
      for (unsigned char c : e) {
        pending = (c & 0xC0) == 0x80 ? pending - 1 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
        auto it = trie[cur].child.find(c);
        int nxt;
        if (it == trie[cur].child.end()) {
          nxt = static_cast<int>(trie.size());
          trie[cur].child[c] = nxt;
          trie.emplace_back();
        } else {
          nxt = it->second;
        }
        cur = nxt;
        trie[cur].pending = pending;
      }
      trie[cur].terminal = true;
    }
    const RuleId free = b_.add_rule("key_rest");
    b_.set_rule(free, b_.seq({b_.star(json_string_char(b_)), b_.literal("\"")}));
    std::vector<RuleId> rules(trie.size());
    for (size_t i = 0; i < trie.size(); ++i) rules[i] = b_.add_rule("key_trie");
    for (size_t i = 0; i < trie.size(); ++i) {
      const TrieNode& t = trie[i];
      std::vector<ExprId> alts;
      if (!t.terminal && t.pending == 0) alts.push_back(b_.literal("\""));
      for (auto [c, nxt] : t.child) alts.push_back(b_.seq({b_.byte_range(c, c), b_.ref(rules[nxt])}));
      if (t.pending > 0) {
        ByteSet cont;
        cont.add_range(0x80, 0xBF);
        for (auto [c, nxt] : t.child) cont.w[c >> 6] &= ~(uint64_t{1} << (c & 63));
        alts.push_back(b_.seq({b_.bytes(cont), b_.repeat(b_.byte_range(0x80, 0xBF), t.pending - 1, t.pending - 1), b_.ref(free)}));
      } else {
        // Code points whose first byte leaves the trie, and escapes.
        std::vector<std::pair<uint32_t, uint32_t>> dev;
        uint32_t next = 0x20;
        auto cut = [&](uint32_t lo, uint32_t hi) {
          if (lo > next) dev.push_back({next, lo - 1});
          next = std::max(next, hi + 1);
        };
        std::vector<std::pair<uint32_t, uint32_t>> removed = {{'"', '"'}, {'\\', '\\'}};
        for (auto [c, nxt] : t.child) {
          if (c < 0x80) removed.push_back({c, c});
          else if (c >= 0xC2 && c <= 0xDF) removed.push_back({uint32_t(c & 0x1F) << 6, (uint32_t(c & 0x1F) << 6) + 63});
          else if (c >= 0xE0 && c <= 0xEF) removed.push_back({uint32_t(c & 0x0F) << 12, (uint32_t(c & 0x0F) << 12) + 0xFFF});
          else if (c >= 0xF0 && c <= 0xF4) removed.push_back({uint32_t(c & 0x07) << 18, (uint32_t(c & 0x07) << 18) + 0x3FFFF});
        }
        std::sort(removed.begin(), removed.end());
        for (auto [lo, hi] : removed) cut(lo, hi);
        if (next <= 0x10FFFF) dev.push_back({next, 0x10FFFF});
        ByteSet esc, hex;
        for (char c : std::string_view("\"\\/bfnrt")) esc.add(uint8_t(c));
        hex.add_range('0', '9');
        hex.add_range('a', 'f');
        hex.add_range('A', 'F');
        const ExprId escape = b_.seq({b_.literal("\\"), b_.alt({b_.bytes(esc), b_.seq({b_.literal("u"), b_.repeat(b_.bytes(hex), 4, 4)})})});
        alts.push_back(b_.seq({b_.alt({b_.code_point_set(dev), escape}), b_.ref(free)}));
      }
      b_.set_rule(rules[i], b_.alt(std::move(alts)));
    }
    return b_.seq({b_.literal("\""), b_.ref(rules[0])});
  }

  ExprId object_expr(const json& s, const std::string& path, int depth) {
    struct Prop {
      std::string key;
      ExprId pair;
      bool required;
    };
    std::vector<Prop> props;
    std::vector<std::string> names;
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) invalid("required " + at(path) + " must be an array");
      for (const auto& r : s["required"]) {
        if (!r.is_string()) invalid("required " + at(path) + " must list strings, not " + r.dump());
        required.insert(r.get<std::string>());
      }
    }
    auto pair_of = [&](const std::string& key, const json& schema, const std::string& p) {
      return b_.seq({b_.literal(json(key).dump()), kv_sep(), as_rule(compile(schema, p, depth + 1), "property " + key)});
    };
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) invalid("properties " + at(path) + " must be an object");
      for (auto it = s["properties"].begin(); it != s["properties"].end(); ++it) {
        names.push_back(it.key());
        const bool req = o_.strict || required.count(it.key());
        if (it.value() == json(false)) {
          if (req) invalid("property '" + it.key() + "' " + at(path) + " is required but its schema is false: unsatisfiable");
          continue;
        }
        props.push_back({it.key(), pair_of(it.key(), it.value(), path + "/properties/" + it.key()), req});
      }
    }
    for (const auto& r : required)
      if (std::find(names.begin(), names.end(), r) == names.end()) {
        names.push_back(r);
        props.push_back({r, pair_of(r, json(true), path + "/required"), true});
      }
    const json addl = s.contains("additionalProperties") ? s["additionalProperties"] : json(true);
    const bool extras = !o_.strict && addl != json(false);
    ExprId x = -1;
    if (extras) {
      x = as_rule(b_.seq({key_excluding(names), kv_sep(), as_rule(compile(addl, path + "/additionalProperties", depth + 1), "additional")}),
                  "extra_property");
    }
    const size_t n = props.size();
    const ExprId sep = item_sep();
    ExprId body;
    if (!extras && std::all_of(props.begin(), props.end(), [](const Prop& p) { return p.required; })) {
      std::vector<ExprId> items;
      for (size_t i = 0; i < n; ++i) {
        if (i) items.push_back(sep);
        items.push_back(props[i].pair);
      }
      body = b_.seq(std::move(items));
    } else {
      // first[i] / rest[i]: properties i.. when none / some have been written (rest leads with a comma).
      std::vector<RuleId> first(n + 1), rest(n + 1);
      for (size_t i = 0; i <= n; ++i) {
        first[i] = b_.add_rule("object_first");
        rest[i] = b_.add_rule("object_rest");
      }
      for (size_t i = n + 1; i-- > 0;) {
        ExprId df, dn;
        if (i == n) {
          df = dn = b_.empty();
        } else {
          const ExprId next_rest = b_.ref(rest[i + 1]);
          df = b_.seq({props[i].pair, next_rest});
          dn = b_.seq({sep, props[i].pair, next_rest});
          if (!props[i].required) {
            df = b_.alt({df, b_.ref(first[i + 1])});
            dn = b_.alt({dn, next_rest});
          }
        }
        if (extras) {
          b_.set_rule(first[i], b_.alt({b_.seq({x, b_.ref(rest[i])}), df}));
          b_.set_rule(rest[i], b_.alt({b_.seq({sep, x, b_.ref(rest[i])}), dn}));
        } else {
          b_.set_rule(first[i], df);
          b_.set_rule(rest[i], dn);
        }
      }
      body = b_.ref(first[0]);
    }
    return b_.seq({b_.literal("{"), ws(), body, ws(), b_.literal("}")});
  }

  ExprId array_expr(const json& s, const std::string& path, int depth) {
    const auto min_items = count_kw(s, "minItems", path), max_items = count_kw(s, "maxItems", path);
    const int64_t lo = min_items.value_or(0), hi = max_items ? *max_items : -1;
    if (hi >= 0 && lo > hi)
      invalid("minItems " + std::to_string(lo) + " > maxItems " + std::to_string(hi) + " " + at(path) + ": unsatisfiable");
    if (s.value("uniqueItems", false) && !(hi >= 0 && hi <= 1))
      unsupported("uniqueItems: true " + at(path) + " is not enforceable by a grammar (only with maxItems <= 1)");
    std::vector<ExprId> prefix;
    json rest = true;
    std::string rest_path = path + "/items";
    auto add_prefix = [&](const json& arr, const std::string& kw) {
      if (!arr.is_array()) invalid(kw + " " + at(path) + " must be an array");
      for (size_t i = 0; i < arr.size() && (hi < 0 || static_cast<int64_t>(i) < hi); ++i)
        prefix.push_back(as_rule(compile(arr[i], path + "/" + kw + "/" + std::to_string(i), depth + 1), "item"));
    };
    if (s.contains("prefixItems")) {
      add_prefix(s["prefixItems"], "prefixItems");
      if (s.contains("items")) rest = s["items"];
    } else if (s.contains("items") && s["items"].is_array()) {
      add_prefix(s["items"], "items");  // draft 7 tuple form
      if (s.contains("additionalItems")) {
        rest = s["additionalItems"];
        rest_path = path + "/additionalItems";
      }
    } else if (s.contains("items")) {
      rest = s["items"];
    }
    if (std::max(lo, hi) > b_.limits().max_repeat)
      fail(ErrorCode::kResourceExhausted, "minItems/maxItems " + at(path) + " past the limit of " + std::to_string(b_.limits().max_repeat));
    const ExprId r = rest == json(false) ? b_.nothing() : as_rule(compile(rest, rest_path, depth + 1), "item");
    const int64_t k = static_cast<int64_t>(prefix.size());
    const ExprId sep = item_sep();
    // tail: the items after the prefix, each led by a separator.
    const int64_t rest_min = std::max<int64_t>(0, lo - k), rest_max = hi < 0 ? -1 : std::max<int64_t>(0, hi - k);
    ExprId tail = b_.repeat(b_.seq({sep, r}), static_cast<int>(rest_min), static_cast<int>(rest_max));
    ExprId list;
    if (k == 0) {
      list = b_.seq({r, b_.repeat(b_.seq({sep, r}), static_cast<int>(std::max<int64_t>(0, lo - 1)), hi < 0 ? -1 : static_cast<int>(hi - 1))});
      if (hi == 0) list = b_.nothing();
      if (lo == 0) list = b_.opt(list);
    } else {
      ExprId cur = tail;
      for (int64_t i = k - 1; i >= 1; --i) {
        cur = b_.seq({sep, prefix[i], cur});
        if (i >= lo) cur = b_.opt(cur);
      }
      list = b_.seq({prefix[0], cur});
      if (lo == 0) list = b_.opt(list);
    }
    return b_.seq({b_.literal("["), ws(), list, ws(), b_.literal("]")});
  }

  GrammarBuilder& b_;
  const json& root_;
  JsonSchemaOptions o_;
  std::map<std::string, RuleId> ref_rules_;
  std::map<int64_t, RuleId> mod_rules_;
  RuleId value_rule_ = -1, object_rule_ = -1, string_rule_ = -1, number_rule_ = -1;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> compile_json_schema(std::string_view schema_text, const JsonSchemaOptions& options,
                                                           const Limits& limits) {
  json root;
  try {
    root = json::parse(schema_text);
  } catch (const json::parse_error& e) {
    return make_error(ErrorCode::kInvalidArgument, std::string("json_schema: invalid JSON: ") + e.what());
  }
  GrammarBuilder b(limits);
  try {
    SchemaCompiler c(b, root, options);
    const RuleId r = b.add_rule("root");
    ExprId body = c.compile(root, "", 0);
    if (!options.prefix.empty() || !options.suffix.empty()) {
      body = b.seq({b.literal(options.prefix), body, b.literal(options.suffix)});
    }
    b.set_rule(r, body);
    auto g = b.build(r);
    if (!g.ok() && g.error().message.find("matches no string") != std::string::npos)
      return make_error(ErrorCode::kInvalidArgument, "json_schema: the schema is unsatisfiable (no JSON value matches it)");
    return g;
  } catch (const SchemaError& e) {
    return make_error(e.code, e.message);
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kInvalidArgument, std::string("json_schema: ") + e.what());
  }
}

Result<std::shared_ptr<const Grammar>> compile_json_object(JsonWhitespace whitespace, const Limits& limits) {
  GrammarBuilder b(limits);
  json root = json::object();
  JsonSchemaOptions o;
  o.whitespace = whitespace;
  SchemaCompiler c(b, root, o);
  const RuleId r = b.add_rule("root");
  b.set_rule(r, c.any_object());
  return b.build(r);
}

const std::vector<KeywordSupport>& json_schema_keywords() {
  static const std::vector<KeywordSupport> t = {
      {"type", "supported (a name or a list; integer within number)"},
      {"enum / const", "supported (values written compactly, filtered by type)"},
      {"anyOf / oneOf", "supported (oneOf as anyOf: exclusivity is not enforced)"},
      {"allOf", "merged into one schema; error where two values cannot be merged"},
      {"$ref / $defs / definitions", "supported: local '#...' pointers, recursive; remote refs and anchors are errors"},
      {"properties / required", "supported (keys in schema order)"},
      {"additionalProperties", "supported (false, true or a schema; extra keys exclude declared names)"},
      {"items / prefixItems / additionalItems", "supported (draft 7 tuple items too)"},
      {"minItems / maxItems", "supported (up to Limits::max_repeat)"},
      {"uniqueItems", "false ignored; true only with maxItems <= 1, else error"},
      {"minLength / maxLength", "supported (code points; not together with pattern or format)"},
      {"pattern", "supported (ECMAScript subset, unanchored unless ^ / $)"},
      {"format", "date, time, date-time, email, uuid, uri, ipv4; int32 on integers; others error"},
      {"minimum / maximum / exclusiveMinimum / exclusiveMaximum", "supported: integers as digit grammars; numbers as decimals (no exponent when bounded)"},
      {"multipleOf", "integers: any divisor <= 1000, or bounded ranges of <= 1024 multiples; else error"},
      {"nullable", "supported (OpenAPI: adds null)"},
      {"title, description, default, examples, $schema, $id, $comment, deprecated, readOnly, writeOnly, $anchor, contentMediaType, contentEncoding",
       "ignored (annotations)"},
      {"not, if/then/else, dependencies, dependentRequired, dependentSchemas, patternProperties, propertyNames, minProperties, maxProperties, contains, unevaluated*",
       "error naming the keyword"},
  };
  return t;
}

}  // namespace strata::grammar
