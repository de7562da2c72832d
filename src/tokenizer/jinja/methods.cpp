#include "tokenizer/jinja/methods.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <unordered_set>

#include "tokenizer/jinja/args.h"
#include "tokenizer/jinja/failure.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/text.h"

namespace strata::tokenizer::jinja {

namespace {

std::optional<std::string> opt_string(const ArgBinder& a, size_t i, const char* fn) {
  if (!a.has(i) || a.get(i).is_none()) return std::nullopt;
  if (!a.get(i).is_string()) fail(std::string("TypeError: ") + fn + " arg must be None or str");
  return a.get(i).as_string();
}

const std::string& str_arg(const Value& v, const char* fn) {
  if (!v.is_string()) fail(std::string("TypeError: ") + fn + "() argument must be str, not " + v.type_name());
  return v.as_string();
}

int64_t int_arg(const Value& v, const char* fn) {
  if (!v.is_int() && !v.is_bool()) fail(std::string("TypeError: ") + fn + "() argument must be int, not " + v.type_name());
  return v.as_int();
}

Value string_list(const std::vector<std::string>& parts) {
  std::vector<Value> items;
  items.reserve(parts.size());
  for (const auto& p : parts) items.emplace_back(p);
  return Value::list(std::move(items));
}

bool affix_match(const std::string& s, const Value& affix, bool prefix, const char* fn) {
  auto one = [&](const std::string& a) {
    if (a.size() > s.size()) return false;
    return prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0;
  };
  if (affix.is_string()) return one(affix.as_string());
  if (affix.is_list() && affix.as_list().kind == SeqKind::kTuple) {
    for (const auto& a : affix.as_list().items) {
      if (one(str_arg(a, fn))) return true;
    }
    return false;
  }
  fail(std::string("TypeError: ") + fn + " first arg must be str or a tuple of str, not " + affix.type_name());
}

bool all_cps(const std::string& s, bool (*pred)(uint32_t)) {
  std::vector<uint32_t> cps = decode_utf8(s);
  if (cps.empty()) return false;
  for (uint32_t cp : cps) {
    if (!pred(cp)) return false;
  }
  return true;
}

std::string pad(const std::string& s, int64_t width, const std::string& fill, int where) {
  int64_t n = static_cast<int64_t>(codepoint_length(s));
  if (width <= n) return s;
  if (width > static_cast<int64_t>(kMaxBuiltSize)) fail("MemoryError: padded string is too large");
  int64_t total = width - n;
  int64_t left = where < 0 ? 0 : where > 0 ? total : total / 2 + (total & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < total - left; ++i) out += fill;
  return out;
}

std::optional<Value> string_method(const std::string& s, const std::string& name) {
  auto bind = [&](auto fn) { return Value::callable("str." + name, fn); };
  if (name == "startswith" || name == "endswith") {
    bool prefix = name == "startswith";
    return bind([s, prefix, name](const CallArgs& c) {
      ArgBinder a(c, name, {"prefix", "start", "end"});
      std::string sub = s;
      if (a.has(1) || a.has(2)) {
        Value sliced = slice_value(Value(s), a.get_or(1, Value::none()), a.get_or(2, Value::none()), Value::none());
        sub = sliced.as_string();
      }
      return Value(affix_match(sub, a.require(0, "prefix"), prefix, name.c_str()));
    });
  }
  if (name == "split" || name == "rsplit") {
    bool right = name == "rsplit";
    return bind([s, right, name](const CallArgs& c) {
      ArgBinder a(c, name, {"sep", "maxsplit"});
      auto sep = opt_string(a, 0, name.c_str());
      int64_t maxsplit = a.has(1) ? int_arg(a.get(1), name.c_str()) : -1;
      return string_list(right ? py_rsplit(s, sep, maxsplit) : py_split(s, sep, maxsplit));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    bool left = name != "rstrip";
    bool right = name != "lstrip";
    return bind([s, left, right, name](const CallArgs& c) {
      ArgBinder a(c, name, {"chars"});
      return Value(py_strip(s, opt_string(a, 0, name.c_str()), left, right));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" || name == "casefold" ||
      name == "swapcase") {
    return bind([s, name](const CallArgs& c) {
      ArgBinder a(c, name, {});
      if (name == "upper") return Value(py_upper(s));
      if (name == "lower" || name == "casefold") return Value(py_lower(s));
      if (name == "title") return Value(py_title(s));
      if (name == "capitalize") return Value(py_capitalize(s));
      std::string out;
      for (uint32_t cp : decode_utf8(s)) {
        std::string ch;
        append_utf8(ch, cp);
        std::string up = py_upper(ch);
        out += up != ch ? up : py_lower(ch);
      }
      return Value(out);
    });
  }
  if (name == "replace") {
    return bind([s](const CallArgs& c) {
      ArgBinder a(c, "replace", {"old", "new", "count"});
      const std::string& o = str_arg(a.require(0, "old"), "replace");
      const std::string& n = str_arg(a.require(1, "new"), "replace");
      int64_t count = a.has(2) ? int_arg(a.get(2), "replace") : -1;
      return Value(py_replace(s, o, n, count));
    });
  }
  if (name == "find" || name == "rfind" || name == "index" || name == "rindex") {
    return bind([s, name](const CallArgs& c) {
      ArgBinder a(c, name, {"sub"});
      int64_t at = py_find(s, str_arg(a.require(0, "sub"), name.c_str()), name[0] == 'r');
      if (at < 0 && (name == "index" || name == "rindex")) fail("ValueError: substring not found");
      return Value(at);
    });
  }
  if (name == "count") {
    return bind([s](const CallArgs& c) {
      ArgBinder a(c, "count", {"sub"});
      return Value(py_count(s, str_arg(a.require(0, "sub"), "count")));
    });
  }
  if (name == "join") {
    return bind([s](const CallArgs& c) {
      ArgBinder a(c, "join", {"iterable"});
      std::string out;
      bool first = true;
      for (const auto& v : iterate(a.require(0, "iterable"))) {
        if (!v.is_string()) fail("TypeError: sequence item: expected str instance, " + v.type_name() + " found");
        if (!first) out += s;
        first = false;
        out += v.as_string();
      }
      return Value(out);
    });
  }
  if (name == "format") {
    return bind([s](const CallArgs& c) { return Value(brace_format(s, c)); });
  }
  if (name == "splitlines") {
    return bind([s](const CallArgs& c) {
      ArgBinder a(c, "splitlines", {"keepends"});
      return string_list(py_splitlines(s, a.get_or(0, Value(false)).truthy()));
    });
  }
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "isnumeric" ||
      name == "isdecimal") {
    return bind([s, name](const CallArgs& c) {
      ArgBinder a(c, name, {});
      if (name == "isalpha") return Value(all_cps(s, py_is_alpha_cp));
      if (name == "isalnum") return Value(all_cps(s, py_is_alnum_cp));
      if (name == "isspace") return Value(all_cps(s, py_isspace));
      return Value(all_cps(s, py_is_digit_cp));
    });
  }
  if (name == "islower" || name == "isupper") {
    bool lower = name == "islower";
    return bind([s, lower, name](const CallArgs& c) {
      ArgBinder a(c, name, {});
      bool cased = false;
      for (uint32_t cp : decode_utf8(s)) {
        std::string ch;
        append_utf8(ch, cp);
        std::string up = py_upper(ch), lo = py_lower(ch);
        if (up == lo) continue;
        cased = true;
        if (lower ? ch != lo : ch != up) return Value(false);
      }
      return Value(cased);
    });
  }
  if (name == "removeprefix" || name == "removesuffix") {
    bool prefix = name == "removeprefix";
    return bind([s, prefix, name](const CallArgs& c) {
      ArgBinder a(c, name, {"affix"});
      const std::string& x = str_arg(a.require(0, "affix"), name.c_str());
      if (affix_match(s, Value(x), prefix, name.c_str())) {
        return Value(prefix ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
      }
      return Value(s);
    });
  }
  if (name == "partition" || name == "rpartition") {
    bool right = name == "rpartition";
    return bind([s, right, name](const CallArgs& c) {
      ArgBinder a(c, name, {"sep"});
      const std::string& sep = str_arg(a.require(0, "sep"), name.c_str());
      if (sep.empty()) fail("ValueError: empty separator");
      size_t at = right ? s.rfind(sep) : s.find(sep);
      std::vector<Value> parts;
      if (at == std::string::npos) {
        parts = right ? std::vector<Value>{Value(""), Value(""), Value(s)} : std::vector<Value>{Value(s), Value(""), Value("")};
      } else {
        parts = {Value(s.substr(0, at)), Value(sep), Value(s.substr(at + sep.size()))};
      }
      return Value::list(std::move(parts), SeqKind::kTuple);
    });
  }
  if (name == "center" || name == "ljust" || name == "rjust" || name == "zfill") {
    return bind([s, name](const CallArgs& c) {
      if (name == "zfill") {
        ArgBinder a(c, name, {"width"});
        int64_t w = int_arg(a.require(0, "width"), "zfill");
        bool sign = !s.empty() && (s[0] == '-' || s[0] == '+');
        std::string body = sign ? s.substr(1) : s;
        std::string padded = pad(body, w - (sign ? 1 : 0), "0", 1);
        return Value(sign ? s.substr(0, 1) + padded : padded);
      }
      ArgBinder a(c, name, {"width", "fillchar"});
      std::string fill = a.has(1) ? str_arg(a.get(1), name.c_str()) : " ";
      if (codepoint_length(fill) != 1) fail("TypeError: The fill character must be exactly one character long");
      int where = name == "center" ? 0 : name == "ljust" ? -1 : 1;
      return Value(pad(s, int_arg(a.require(0, "width"), name.c_str()), fill, where));
    });
  }
  return std::nullopt;
}

const std::unordered_set<std::string>& mutating_methods(bool dict) {
  static const std::unordered_set<std::string> kList = {"append", "extend", "insert", "pop", "remove", "clear", "sort", "reverse"};
  static const std::unordered_set<std::string> kDict = {"pop", "popitem", "update", "setdefault", "clear"};
  return dict ? kDict : kList;
}

Value unsafe(const std::string& type, const std::string& name) {
  return Value::callable(type + "." + name, [type, name](const CallArgs&) -> Value {
    fail("SecurityError: access to attribute '" + name + "' of '" + type + "' object is unsafe.");
  });
}

std::optional<Value> dict_method(const Value& obj, const std::string& name) {
  if (mutating_methods(true).count(name)) return unsafe("dict", name);
  if (name == "items" || name == "keys" || name == "values") {
    return Value::callable("dict." + name, [obj, name](const CallArgs& c) {
      ArgBinder a(c, name, {});
      std::vector<Value> out;
      for (const auto& [k, v] : obj.as_dict().entries()) {
        if (name == "items") out.push_back(Value::list({k, v}, SeqKind::kTuple));
        else out.push_back(name == "keys" ? k : v);
      }
      SeqKind kind = name == "items" ? SeqKind::kDictItems : name == "keys" ? SeqKind::kDictKeys : SeqKind::kDictValues;
      return Value::list(std::move(out), kind);
    });
  }
  if (name == "get") {
    return Value::callable("dict.get", [obj](const CallArgs& c) {
      ArgBinder a(c, "get", {"key", "default"});
      const Value* v = obj.as_dict().find(a.require(0, "key"));
      return v ? *v : a.get_or(1, Value::none());
    });
  }
  if (name == "copy") {
    return Value::callable("dict.copy", [obj](const CallArgs& c) {
      ArgBinder a(c, "copy", {});
      return Value::dict(std::make_shared<Dict>(obj.as_dict()));
    });
  }
  return std::nullopt;
}

std::optional<Value> list_method(const Value& obj, const std::string& name) {
  const char* type = obj.as_list().kind == SeqKind::kTuple ? "tuple" : "list";
  if (mutating_methods(false).count(name)) return unsafe(type, name);
  if (name == "index" || name == "count") {
    return Value::callable(std::string(type) + "." + name, [obj, name](const CallArgs& c) {
      ArgBinder a(c, name, {"value"});
      const Value& x = a.require(0, "value");
      int64_t n = 0;
      const auto& items = obj.as_list().items;
      for (size_t i = 0; i < items.size(); ++i) {
        if (!values_equal(items[i], x)) continue;
        if (name == "index") return Value(static_cast<int64_t>(i));
        ++n;
      }
      if (name == "index") fail("ValueError: " + to_repr(x) + " is not in list");
      return Value(n);
    });
  }
  return std::nullopt;
}

// One printf conversion of Python's % operator.
std::string convert_one(char conv, const std::string& flags, int width, int precision, const Value& v) {
  std::string spec = "%" + flags;
  if (width >= 0) spec += std::to_string(width);
  if (precision >= 0) spec += "." + std::to_string(precision);
  char buf[512];
  switch (conv) {
    case 's': case 'r': case 'a': {
      std::string s = conv == 's' ? to_str(v) : to_repr(v);
      if (precision >= 0) s = s.substr(0, static_cast<size_t>(precision));
      int n = static_cast<int>(codepoint_length(s));
      if (width > n) {
        std::string padding(static_cast<size_t>(width - n), ' ');
        return flags.find('-') != std::string::npos ? s + padding : padding + s;
      }
      return s;
    }
    case 'd': case 'i': case 'u': {
      if (!v.is_number()) fail("TypeError: %" + std::string(1, conv) + " format: a real number is required, not " + v.type_name());
      int64_t i = v.is_float() ? static_cast<int64_t>(v.as_float()) : v.as_int();
      std::snprintf(buf, sizeof(buf), (spec + "lld").c_str(), static_cast<long long>(i));
      return buf;
    }
    case 'x': case 'X': case 'o': {
      if (!v.is_int() && !v.is_bool()) fail("TypeError: %" + std::string(1, conv) + " format: an integer is required, not " + v.type_name());
      int64_t i = v.as_int();
      std::snprintf(buf, sizeof(buf), (spec + "ll" + conv).c_str(), static_cast<unsigned long long>(i < 0 ? -i : i));
      return (i < 0 ? "-" : "") + std::string(buf);
    }
    case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
      if (!v.is_number()) fail("TypeError: must be real number, not " + v.type_name());
      std::snprintf(buf, sizeof(buf), (spec + conv).c_str(), v.as_float());
      return buf;
    }
    case 'c': {
      if (v.is_string()) return v.as_string();
      std::string s;
      append_utf8(s, static_cast<uint32_t>(int_arg(v, "%c")));
      return s;
    }
    default:
      fail(std::string("ValueError: unsupported format character '") + conv + "'");
  }
}

}  // namespace

std::optional<Value> find_method(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kString: return string_method(obj.as_string(), name);
    case Value::Kind::kDict: return dict_method(obj, name);
    case Value::Kind::kList:
      if (obj.as_list().kind == SeqKind::kList || obj.as_list().kind == SeqKind::kTuple) return list_method(obj, name);
      return std::nullopt;
    default: return std::nullopt;
  }
}

std::string percent_format(const std::string& fmt, const Value& args) {
  std::vector<Value> positional;
  bool mapping = args.is_dict();
  if (args.is_list() && args.as_list().kind == SeqKind::kTuple) positional = args.as_list().items;
  else if (!mapping) positional = {args};
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out += fmt[i];
      continue;
    }
    if (++i >= fmt.size()) fail("ValueError: incomplete format");
    const Value* v = nullptr;
    Value keyed;
    if (fmt[i] == '(') {
      size_t close = fmt.find(')', i);
      if (close == std::string::npos || !mapping) fail("TypeError: format requires a mapping");
      const Value* found = args.as_dict().find(fmt.substr(i + 1, close - i - 1));
      if (!found) fail("KeyError: '" + fmt.substr(i + 1, close - i - 1) + "'");
      keyed = *found;
      v = &keyed;
      i = close + 1;
    }
    std::string flags;
    while (i < fmt.size() && std::string("-+ #0").find(fmt[i]) != std::string::npos) flags += fmt[i++];
    int width = -1, precision = -1;
    while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) width = std::max(width, 0) * 10 + (fmt[i++] - '0');
    if (i < fmt.size() && fmt[i] == '.') {
      precision = 0;
      ++i;
      while (i < fmt.size() && std::isdigit(static_cast<unsigned char>(fmt[i]))) precision = precision * 10 + (fmt[i++] - '0');
    }
    if (width > 4096 || precision > 4096) fail("ValueError: format width or precision too large");
    if (i >= fmt.size()) fail("ValueError: incomplete format");
    char conv = fmt[i];
    if (conv == '%') {
      out += '%';
      continue;
    }
    if (!v) {
      if (next >= positional.size()) fail("TypeError: not enough arguments for format string");
      v = &positional[next++];
    }
    out += convert_one(conv, flags, width, precision, *v);
  }
  if (!mapping && next < positional.size()) fail("TypeError: not all arguments converted during string formatting");
  return out;
}

std::string brace_format(const std::string& fmt, const CallArgs& args) {
  std::string out;
  size_t auto_index = 0;
  for (size_t i = 0; i < fmt.size(); ++i) {
    char c = fmt[i];
    if (c == '}' ) {
      if (i + 1 < fmt.size() && fmt[i + 1] == '}') ++i;
      else fail("ValueError: Single '}' encountered in format string");
      out += '}';
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < fmt.size() && fmt[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    size_t close = fmt.find('}', i);
    if (close == std::string::npos) fail("ValueError: Single '{' encountered in format string");
    std::string field = fmt.substr(i + 1, close - i - 1);
    i = close;
    size_t colon = field.find(':');
    std::string spec = colon == std::string::npos ? "" : field.substr(colon + 1);
    std::string key = field.substr(0, colon);
    char conv = 0;
    if (key.size() >= 2 && key[key.size() - 2] == '!') {
      conv = key.back();
      key.resize(key.size() - 2);
    }
    Value v;
    if (key.empty()) {
      if (auto_index >= args.positional.size()) fail("IndexError: Replacement index " + std::to_string(auto_index) + " out of range for positional args tuple");
      v = args.positional[auto_index++];
    } else if (std::isdigit(static_cast<unsigned char>(key[0]))) {
      size_t k = std::stoul(key);
      if (k >= args.positional.size()) fail("IndexError: Replacement index " + key + " out of range for positional args tuple");
      v = args.positional[k];
    } else {
      bool found = false;
      for (const auto& [name, value] : args.keyword) {
        if (name == key) {
          v = value;
          found = true;
        }
      }
      if (!found) fail("KeyError: '" + key + "'");
    }
    std::string text = conv == 'r' ? to_repr(v) : to_str(v);
    if (!spec.empty()) {
      // Only the common numeric precision spec ("{:.2f}") is interpreted.
      if (spec.size() >= 2 && spec[0] == '.' && (spec.back() == 'f' || spec.back() == 'e' || spec.back() == 'g') && v.is_number()) {
        text = convert_one(spec.back(), "", -1, std::atoi(spec.substr(1).c_str()), v);
      } else {
        fail("ValueError: unsupported format spec '" + spec + "'");
      }
    }
    out += text;
  }
  return out;
}

}  // namespace strata::tokenizer::jinja
