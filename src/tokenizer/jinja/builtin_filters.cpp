// The filters of jinja2 that chat templates use, with jinja2's argument names and
// defaults, and transformers' `tojson` (json.dumps with ensure_ascii=False).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <unordered_map>

#include "tokenizer/jinja/args.h"
#include "tokenizer/jinja/builtins.h"
#include "tokenizer/jinja/failure.h"
#include "tokenizer/jinja/json.h"
#include "tokenizer/jinja/methods.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/text.h"

namespace strata::tokenizer::jinja {

namespace {

using FilterFn = std::function<Value(const Value&, const CallArgs&)>;

// jinja2's make_attrgetter: "a.b.0" looks up a, then b, then item 0.
Value lookup_path(const Value& item, const Value& attribute) {
  if (!attribute.is_string()) return get_item(item, attribute);
  Value cur = item;
  const std::string& path = attribute.as_string();
  size_t start = 0;
  while (true) {
    size_t dot = path.find('.', start);
    std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) { return c >= '0' && c <= '9'; });
    cur = digits ? get_item(cur, Value(static_cast<int64_t>(std::stoll(part)))) : get_item(cur, Value(part));
    if (dot == std::string::npos) return cur;
    start = dot + 1;
  }
}

// Sort and unique keys: strings fold to lower case unless case_sensitive.
Value fold_case(const Value& v, bool case_sensitive) {
  return (!case_sensitive && v.is_string()) ? Value(py_lower(v.as_string())) : v;
}

Value round_value(const Value& v, int64_t precision, const std::string& method) {
  if (method != "common" && method != "ceil" && method != "floor") {
    fail("FilterArgumentError: method must be common, ceil or floor");
  }
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) fail("TypeError: type " + v.type_name() + " doesn't define __round__ method");
  if (method == "common") {
    if (!v.is_float()) return Value(v.as_int());
    double x = v.as_float();
    if (!std::isfinite(x)) return v;
    if (precision > 300) return v;
    // printf rounds the exact binary value half-to-even, as Python's round() does.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f", static_cast<int>(std::max<int64_t>(precision, 0)), x);
    double r = std::strtod(buf, nullptr);
    if (precision < 0) {
      double scale = std::pow(10.0, static_cast<double>(-precision));
      r = std::nearbyint(x / scale) * scale;
    }
    return Value(r);
  }
  double scale = std::pow(10.0, static_cast<double>(precision));
  double y = v.as_float() * scale;
  return Value((method == "ceil" ? std::ceil(y) : std::floor(y)) / scale);
}

// Python int(str, base) for the `int` filter; nullopt where Python raises ValueError.
std::optional<int64_t> parse_int(const std::string& text, int64_t base) {
  std::string s = py_strip(text, std::nullopt, true, true);
  std::string digits;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '_' && i > 0 && i + 1 < s.size() && std::isalnum(static_cast<unsigned char>(s[i - 1])) &&
        std::isalnum(static_cast<unsigned char>(s[i + 1]))) {
      continue;
    }
    digits += s[i];
  }
  if (digits.empty()) return std::nullopt;
  size_t p = 0;
  bool neg = false;
  if (digits[0] == '+' || digits[0] == '-') {
    neg = digits[0] == '-';
    ++p;
  }
  if (base == 0 || base == 16 || base == 8 || base == 2) {
    if (digits.size() > p + 1 && digits[p] == '0') {
      char x = static_cast<char>(std::tolower(static_cast<unsigned char>(digits[p + 1])));
      int64_t prefixed = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
      if (prefixed && (base == 0 || base == prefixed)) {
        base = prefixed;
        p += 2;
      }
    }
    if (base == 0) base = 10;
  }
  if (p >= digits.size() || base < 2 || base > 36) return std::nullopt;
  __int128 value = 0;
  for (; p < digits.size(); ++p) {
    int d = std::isdigit(static_cast<unsigned char>(digits[p])) ? digits[p] - '0'
          : std::isalpha(static_cast<unsigned char>(digits[p])) ? std::tolower(static_cast<unsigned char>(digits[p])) - 'a' + 10 : 99;
    if (d >= base) return std::nullopt;
    value = value * base + d;
    if (value > static_cast<__int128>(INT64_MAX)) fail("OverflowError: integer out of the 64-bit range");
  }
  return static_cast<int64_t>(neg ? -value : value);
}

std::optional<double> parse_float(const Value& v) {
  if (v.is_number()) return v.as_float();
  if (!v.is_string()) return std::nullopt;
  std::string s = py_strip(v.as_string(), std::nullopt, true, true);
  std::string clean;
  for (char c : s) {
    if (c != '_') clean += c;
  }
  if (clean.empty()) return std::nullopt;
  std::string lower = py_lower(clean);
  std::string body = (lower[0] == '+' || lower[0] == '-') ? lower.substr(1) : lower;
  if (body == "inf" || body == "infinity" || body == "nan") {
    double x = body == "nan" ? NAN : INFINITY;
    return lower[0] == '-' ? -x : x;
  }
  char* end = nullptr;
  double x = std::strtod(clean.c_str(), &end);
  if (end != clean.c_str() + clean.size()) return std::nullopt;
  if (clean.find_first_of("xXpP") != std::string::npos) return std::nullopt;  // strtod's hex floats
  return x;
}

std::vector<Value> select_items(const Value& seq, const CallArgs& c, bool by_attr, bool keep, const char* fn) {
  size_t first_arg = by_attr ? 1 : 0;
  if (by_attr && c.positional.empty()) fail(std::string(fn) + "() missing required argument 'attribute'");
  std::optional<std::string> test;
  if (c.positional.size() > first_arg) {
    const Value& t = c.positional[first_arg];
    if (!t.is_string()) fail(std::string("TypeError: ") + fn + "() test name must be a string");
    test = t.as_string();
    if (!is_known_test(*test)) fail("TemplateRuntimeError: No test named '" + *test + "'.");
  }
  CallArgs test_args;
  for (size_t i = first_arg + 1; i < c.positional.size(); ++i) test_args.positional.push_back(c.positional[i]);
  test_args.keyword = c.keyword;
  std::vector<Value> out;
  for (const auto& item : iterate(seq)) {
    Value subject = by_attr ? lookup_path(item, c.positional[0]) : item;
    bool pass = test ? apply_test(*test, subject, test_args) : subject.truthy();
    if (pass == keep) out.push_back(item);
  }
  return out;
}

std::vector<std::string> indent_lines(const std::string& s) { return py_splitlines(s); }

Value do_indent(const Value& v, const CallArgs& c) {
  ArgBinder a(c, "indent", {"width", "first", "blank"});
  Value width = a.get_or(0, Value(int64_t{4}));
  std::string indention;
  if (width.is_string()) {
    indention = width.as_string();
  } else {
    if (!width.is_int() && !width.is_bool()) fail("TypeError: indent width must be an int or a string");
    if (width.as_int() > 4096) fail("ValueError: indent width too large");
    indention = std::string(static_cast<size_t>(std::max<int64_t>(width.as_int(), 0)), ' ');
  }
  bool first = a.get_or(1, Value(false)).truthy();
  bool blank = a.get_or(2, Value(false)).truthy();
  std::string s = to_str(v) + "\n";  // jinja2 appends a newline so splitlines keeps a trailing empty line
  std::vector<std::string> lines = indent_lines(s);
  std::string rv;
  if (blank) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i) rv += "\n" + indention;
      rv += lines[i];
    }
  } else if (!lines.empty()) {
    rv = lines[0];
    if (lines.size() > 1) {
      rv += "\n";
      for (size_t i = 1; i < lines.size(); ++i) {
        if (i > 1) rv += "\n";
        rv += lines[i].empty() ? lines[i] : indention + lines[i];
      }
    }
  }
  if (first) rv = indention + rv;
  return Value(rv);
}

Value do_tojson(const Value& v, const CallArgs& c) {
  ArgBinder a(c, "tojson", {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonDumpOptions o;
  o.ensure_ascii = a.get_or(0, Value(false)).truthy();
  Value indent = a.get_or(1, Value::none());
  if (indent.is_string()) {
    o.indent = indent.as_string();
  } else if (indent.is_int() || indent.is_bool()) {
    if (indent.as_int() > 4096) fail("ValueError: indent too large");
    o.indent = std::string(static_cast<size_t>(std::max<int64_t>(indent.as_int(), 0)), ' ');
  } else if (!indent.is_none()) {
    fail("TypeError: tojson indent must be an int or a string");
  }
  Value sep = a.get_or(2, Value::none());
  if (sep.is_list() && sep.as_list().items.size() == 2 && sep.as_list().items[0].is_string() && sep.as_list().items[1].is_string()) {
    o.item_separator = sep.as_list().items[0].as_string();
    o.key_separator = sep.as_list().items[1].as_string();
  } else if (!sep.is_none()) {
    fail("TypeError: tojson separators must be a pair of strings");
  } else if (o.indent) {
    o.item_separator = ",";  // json.dumps drops the space after ',' when indenting
  }
  o.sort_keys = a.get_or(3, Value(false)).truthy();
  return Value(dump_json(v, o));
}

std::vector<Value> sorted_items(std::vector<Value> items, bool reverse, const std::function<Value(const Value&)>& key) {
  std::vector<std::pair<Value, Value>> keyed;
  keyed.reserve(items.size());
  for (auto& item : items) keyed.emplace_back(key(item), std::move(item));
  std::stable_sort(keyed.begin(), keyed.end(), [reverse](const auto& x, const auto& y) {
    return reverse ? value_less(y.first, x.first) : value_less(x.first, y.first);
  });
  std::vector<Value> out;
  out.reserve(keyed.size());
  for (auto& kv : keyed) out.push_back(std::move(kv.second));
  return out;
}

Value min_max(const Value& v, const CallArgs& c, bool want_max) {
  ArgBinder a(c, want_max ? "max" : "min", {"case_sensitive", "attribute"});
  bool cs = a.get_or(0, Value(false)).truthy();
  Value attr = a.get_or(1, Value::none());
  std::vector<Value> items = iterate(v);
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  auto key = [&](const Value& x) { return fold_case(attr.is_none() ? x : lookup_path(x, attr), cs); };
  size_t best = 0;
  Value best_key = key(items[0]);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = key(items[i]);
    if (want_max ? value_less(best_key, k) : value_less(k, best_key)) {
      best = i;
      best_key = k;
    }
  }
  return items[best];
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += ch;
    }
  }
  return out;
}

const std::unordered_map<std::string, FilterFn>& filters() {
  static const std::unordered_map<std::string, FilterFn> kFilters = [] {
    std::unordered_map<std::string, FilterFn> f;
    f["tojson"] = do_tojson;
    f["trim"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "trim", {"chars"});
      Value chars = a.get_or(0, Value::none());
      std::optional<std::string> set;
      if (chars.is_string()) set = chars.as_string();
      return Value(py_strip(to_str(v), set, true, true));
    };
    f["length"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "length", {});
      return Value(length_of(v));
    };
    f["count"] = f["length"];
    f["first"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "first", {});
      std::vector<Value> items = iterate(v);
      return items.empty() ? Value::undefined("No first item, sequence was empty.") : items.front();
    };
    f["last"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "last", {});
      std::vector<Value> items = iterate(v);
      return items.empty() ? Value::undefined("No last item, sequence was empty.") : items.back();
    };
    f["items"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "items", {});
      if (v.is_undefined()) return Value::list({});
      if (!v.is_dict()) fail("TypeError: Can only get item pairs from a mapping.");
      std::vector<Value> out;
      for (const auto& [k, val] : v.as_dict().entries()) out.push_back(Value::list({k, val}, SeqKind::kTuple));
      return Value::list(std::move(out));
    };
    f["join"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "join", {"d", "attribute"});
      std::string sep = to_str(a.get_or(0, Value("")));
      Value attr = a.get_or(1, Value::none());
      std::string out;
      bool first = true;
      for (const auto& item : iterate(v)) {
        if (!first) out += sep;
        first = false;
        out += to_str(attr.is_none() ? item : lookup_path(item, attr));
      }
      return Value(out);
    };
    f["default"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "default", {"default_value", "boolean"});
      bool boolean = a.get_or(1, Value(false)).truthy();
      if (v.is_undefined() || (boolean && !v.truthy())) return a.get_or(0, Value(""));
      return v;
    };
    f["d"] = f["default"];
    f["string"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "string", {});
      return Value(to_str(v));
    };
    f["safe"] = f["string"];
    f["upper"] = [](const Value& v, const CallArgs& c) { ArgBinder a(c, "upper", {}); return Value(py_upper(to_str(v))); };
    f["lower"] = [](const Value& v, const CallArgs& c) { ArgBinder a(c, "lower", {}); return Value(py_lower(to_str(v))); };
    f["capitalize"] = [](const Value& v, const CallArgs& c) { ArgBinder a(c, "capitalize", {}); return Value(py_capitalize(to_str(v))); };
    f["title"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "title", {});
      // jinja2 upper-cases the first character after each run of '-', whitespace or an
      // opening bracket, and lower-cases the rest.
      std::vector<uint32_t> cps = decode_utf8(to_str(v));
      std::string out;
      bool word_start = true;
      for (uint32_t cp : cps) {
        bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || py_isspace(cp);
        std::string ch;
        append_utf8(ch, cp);
        out += word_start ? py_upper(ch) : py_lower(ch);
        word_start = sep;
      }
      return Value(out);
    };
    f["replace"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "replace", {"old", "new", "count"});
      Value count = a.get_or(2, Value::none());
      return Value(py_replace(to_str(v), to_str(a.require(0, "old")), to_str(a.require(1, "new")),
                              count.is_none() ? -1 : count.as_int()));
    };
    f["list"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "list", {});
      return Value::list(iterate(v));
    };
    f["map"] = [](const Value& v, const CallArgs& c) {
      std::vector<Value> out;
      const Value* attribute = nullptr;
      const Value* fallback = nullptr;
      for (const auto& [k, val] : c.keyword) {
        if (k == "attribute") attribute = &val;
        else if (k == "default") fallback = &val;
      }
      if (attribute) {
        for (const auto& item : iterate(v)) {
          Value r = lookup_path(item, *attribute);
          out.push_back(r.is_undefined() && fallback ? *fallback : r);
        }
        return Value::list(std::move(out));
      }
      if (c.positional.empty() || !c.positional[0].is_string()) fail("FilterArgumentError: map requires a filter name or attribute=");
      std::string name = c.positional[0].as_string();
      if (!is_known_filter(name)) fail("TemplateRuntimeError: No filter named '" + name + "'.");
      CallArgs rest;
      rest.positional.assign(c.positional.begin() + 1, c.positional.end());
      rest.keyword = c.keyword;
      for (const auto& item : iterate(v)) out.push_back(apply_filter(name, item, rest));
      return Value::list(std::move(out));
    };
    f["select"] = [](const Value& v, const CallArgs& c) { return Value::list(select_items(v, c, false, true, "select")); };
    f["reject"] = [](const Value& v, const CallArgs& c) { return Value::list(select_items(v, c, false, false, "reject")); };
    f["selectattr"] = [](const Value& v, const CallArgs& c) { return Value::list(select_items(v, c, true, true, "selectattr")); };
    f["rejectattr"] = [](const Value& v, const CallArgs& c) { return Value::list(select_items(v, c, true, false, "rejectattr")); };
    f["int"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "int", {"default", "base"});
      Value fallback = a.get_or(0, Value(int64_t{0}));
      int64_t base = a.get_or(1, Value(int64_t{10})).as_int();
      if (v.is_string()) {
        if (auto i = parse_int(v.as_string(), base)) return Value(*i);
      } else if (v.is_int() || v.is_bool()) {
        return Value(v.as_int());
      }
      auto f = parse_float(v);
      if (f && std::isfinite(*f) && std::fabs(*f) < 9.2e18) return Value(static_cast<int64_t>(*f));
      return fallback;
    };
    f["float"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "float", {"default"});
      auto f = parse_float(v);
      return f ? Value(*f) : a.get_or(0, Value(0.0));
    };
    f["abs"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "abs", {});
      if (!v.is_number()) fail("TypeError: bad operand type for abs(): '" + v.type_name() + "'");
      if (v.is_float()) return Value(std::fabs(v.as_float()));
      return v.as_int() < 0 ? negate(v, true) : Value(v.as_int());
    };
    f["round"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "round", {"precision", "method"});
      return round_value(v, a.get_or(0, Value(int64_t{0})).as_int(), to_str(a.get_or(1, Value("common"))));
    };
    f["indent"] = do_indent;
    f["wordcount"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "wordcount", {});
      int64_t n = 0;
      bool in_word = false;
      for (uint32_t cp : decode_utf8(to_str(v))) {
        bool w = cp == '_' || py_is_alnum_cp(cp);
        if (w && !in_word) ++n;
        in_word = w;
      }
      return Value(n);
    };
    f["unique"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "unique", {"case_sensitive", "attribute"});
      bool cs = a.get_or(0, Value(false)).truthy();
      Value attr = a.get_or(1, Value::none());
      auto seen = std::make_shared<Dict>();
      std::vector<Value> out;
      for (const auto& item : iterate(v)) {
        Value key = fold_case(attr.is_none() ? item : lookup_path(item, attr), cs);
        if (seen->find(key)) continue;
        seen->set(key, Value(true));
        out.push_back(item);
      }
      return Value::list(std::move(out));
    };
    f["sort"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "sort", {"reverse", "case_sensitive", "attribute"});
      bool reverse = a.get_or(0, Value(false)).truthy();
      bool cs = a.get_or(1, Value(false)).truthy();
      Value attr = a.get_or(2, Value::none());
      std::vector<Value> attrs;
      if (attr.is_string()) {
        for (const auto& part : py_split(attr.as_string(), std::string(","), -1)) attrs.emplace_back(py_strip(part, std::nullopt, true, true));
      } else if (!attr.is_none()) {
        attrs.push_back(attr);
      }
      return Value::list(sorted_items(iterate(v), reverse, [&](const Value& x) {
        if (attrs.empty()) return fold_case(x, cs);
        if (attrs.size() == 1) return fold_case(lookup_path(x, attrs[0]), cs);
        std::vector<Value> keys;
        for (const auto& at : attrs) keys.push_back(fold_case(lookup_path(x, at), cs));
        return Value::list(std::move(keys));
      }));
    };
    f["dictsort"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "dictsort", {"case_sensitive", "by", "reverse"});
      bool cs = a.get_or(0, Value(false)).truthy();
      std::string by = to_str(a.get_or(1, Value("key")));
      bool reverse = a.get_or(2, Value(false)).truthy();
      if (by != "key" && by != "value") fail("FilterArgumentError: You can only sort by either \"key\" or \"value\"");
      if (!v.is_dict()) fail("TypeError: dictsort expects a mapping, got " + v.type_name());
      std::vector<Value> items;
      for (const auto& [k, val] : v.as_dict().entries()) items.push_back(Value::list({k, val}, SeqKind::kTuple));
      size_t pos = by == "key" ? 0 : 1;
      return Value::list(sorted_items(std::move(items), reverse, [&](const Value& x) { return fold_case(x.as_list().items[pos], cs); }));
    };
    f["sum"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "sum", {"attribute", "start"});
      Value attr = a.get_or(0, Value::none());
      Value total = a.get_or(1, Value(int64_t{0}));
      for (const auto& item : iterate(v)) total = binary_op(BinaryOp::kAdd, total, attr.is_none() ? item : lookup_path(item, attr));
      return total;
    };
    f["min"] = [](const Value& v, const CallArgs& c) { return min_max(v, c, false); };
    f["max"] = [](const Value& v, const CallArgs& c) { return min_max(v, c, true); };
    f["batch"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "batch", {"linecount", "fill_with"});
      int64_t n = a.require(0, "linecount").as_int();
      if (n <= 0) fail("ValueError: batch size must be positive");
      Value fill = a.get_or(1, Value::none());
      std::vector<Value> out, cur;
      for (const auto& item : iterate(v)) {
        cur.push_back(item);
        if (static_cast<int64_t>(cur.size()) == n) {
          out.push_back(Value::list(std::move(cur)));
          cur.clear();
        }
      }
      if (!cur.empty()) {
        if (a.has(1) && !fill.is_none()) while (static_cast<int64_t>(cur.size()) < n) cur.push_back(fill);
        out.push_back(Value::list(std::move(cur)));
      }
      return Value::list(std::move(out));
    };
    f["reverse"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "reverse", {});
      if (v.is_string()) {
        std::vector<uint32_t> cps = decode_utf8(v.as_string());
        std::reverse(cps.begin(), cps.end());
        return Value(encode_utf8(cps));
      }
      std::vector<Value> items = iterate(v);
      std::reverse(items.begin(), items.end());
      return Value::list(std::move(items));
    };
    f["escape"] = [](const Value& v, const CallArgs& c) { ArgBinder a(c, "escape", {}); return Value(html_escape(to_str(v))); };
    f["e"] = f["escape"];
    f["format"] = [](const Value& v, const CallArgs& c) {
      if (!c.positional.empty() && !c.keyword.empty()) fail("FilterArgumentError: can't handle positional and keyword arguments at the same time");
      if (!c.keyword.empty()) {
        auto d = std::make_shared<Dict>();
        for (const auto& [k, val] : c.keyword) d->set(Value(k), val);
        return Value(percent_format(to_str(v), Value::dict(d)));
      }
      return Value(percent_format(to_str(v), Value::list(c.positional, SeqKind::kTuple)));
    };
    f["attr"] = [](const Value& v, const CallArgs& c) {
      // Python attributes only: a dict's keys are not its attributes.
      ArgBinder a(c, "attr", {"name"});
      std::string name = to_str(a.require(0, "name"));
      if (v.is_undefined()) return Value::undefined("'" + name + "' is undefined");
      if (v.is_namespace()) return get_attr(v, name);
      if (auto m = find_method(v, name)) return *m;
      return Value::undefined("'" + v.type_name() + " object' has no attribute '" + name + "'");
    };
    f["center"] = [](const Value& v, const CallArgs& c) {
      ArgBinder a(c, "center", {"width"});
      CallArgs m;
      m.positional.push_back(a.get_or(0, Value(int64_t{80})));
      return find_method(Value(to_str(v)), "center")->as_callable().fn(m);
    };
    return f;
  }();
  return kFilters;
}

}  // namespace

bool is_known_filter(const std::string& name) { return filters().count(name) != 0; }

Value apply_filter(const std::string& name, const Value& value, const CallArgs& args) {
  auto it = filters().find(name);
  if (it == filters().end()) fail("TemplateAssertionError: No filter named '" + name + "'.");
  return it->second(value, args);
}

}  // namespace strata::tokenizer::jinja
