#include "tokenizer/jinja/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

#include <utf8proc.h>

#include "tokenizer/jinja/failure.h"

namespace strata::tokenizer::jinja {

namespace {

const std::shared_ptr<const std::string>& empty_string() {
  static const auto kEmpty = std::make_shared<const std::string>();
  return kEmpty;
}

// Python's str.isprintable() for one code point: everything but the "Other" and
// "Separator" categories, except the ASCII space.
bool python_printable(int32_t cp) {
  if (cp == ' ') return true;
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS:
      return false;
    default:
      return true;
  }
}

// Values can nest without bound (a namespace may hold itself, a loop may wrap a list a
// million times), so every recursive walk carries a depth and gives up past kMaxDepth.
[[noreturn]] void too_deep() { fail("RecursionError: maximum recursion depth exceeded"); }

std::string repr_at(const Value& v, int depth);

std::string seq_repr(const List& l, int depth) {
  std::string out;
  const char* open = "[";
  const char* close = "]";
  switch (l.kind) {
    case SeqKind::kList: break;
    case SeqKind::kTuple: open = "("; close = ")"; break;
    case SeqKind::kDictItems: open = "dict_items(["; close = "])"; break;
    case SeqKind::kDictKeys: open = "dict_keys(["; close = "])"; break;
    case SeqKind::kDictValues: open = "dict_values(["; close = "])"; break;
  }
  out += open;
  for (size_t i = 0; i < l.items.size(); ++i) {
    if (i) out += ", ";
    out += repr_at(l.items[i], depth + 1);
  }
  if (l.kind == SeqKind::kTuple && l.items.size() == 1) out += ",";
  out += close;
  return out;
}

std::string dict_repr(const Dict& d, int depth) {
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : d.entries()) {
    if (!first) out += ", ";
    first = false;
    out += repr_at(k, depth + 1) + ": " + repr_at(v, depth + 1);
  }
  return out + "}";
}

}  // namespace

const Value* Dict::find(const Value& key) const {
  auto it = index_.find(dict_key(key));
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

const Value* Dict::find(const std::string& key) const {
  auto it = index_.find("s" + key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void Dict::set(const Value& key, Value value) {
  std::string k = dict_key(key);
  auto it = index_.find(k);
  if (it != index_.end()) {
    entries_[it->second].second = std::move(value);
    return;
  }
  index_.emplace(std::move(k), entries_.size());
  entries_.emplace_back(key, std::move(value));
}

Value Value::undefined(std::string hint) {
  Value v;
  v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value::Value(bool b) : kind_(Kind::kBool), b_(b) {}
Value::Value(int64_t i) : kind_(Kind::kInt), i_(i) {}
Value::Value(double f) : kind_(Kind::kFloat), f_(f) {}
Value::Value(std::string s) : kind_(Kind::kString), s_(std::make_shared<const std::string>(std::move(s))) {}

Value Value::list(std::vector<Value> items, SeqKind kind) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const List>(List{std::move(items), kind});
  return v;
}

Value Value::dict(std::shared_ptr<Dict> d) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::move(d);
  return v;
}

Value Value::make_namespace(std::shared_ptr<Dict> attrs) {
  Value v;
  v.kind_ = Kind::kNamespace;
  v.dict_ = std::move(attrs);
  return v;
}

Value Value::callable(std::string name, std::function<Value(const CallArgs&)> fn) {
  Value v;
  v.kind_ = Kind::kCallable;
  v.fn_ = std::make_shared<const Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

const std::string& Value::undefined_hint() const { return s_ ? *s_ : *empty_string(); }

double Value::as_float() const {
  switch (kind_) {
    case Kind::kFloat: return f_;
    case Kind::kInt: return static_cast<double>(i_);
    case Kind::kBool: return b_ ? 1.0 : 0.0;
    default: return 0.0;
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined: case Kind::kNone: return false;
    case Kind::kBool: return b_;
    case Kind::kInt: return i_ != 0;
    case Kind::kFloat: return f_ != 0.0;
    case Kind::kString: return !s_->empty();
    case Kind::kList: return !list_->items.empty();
    case Kind::kDict: return dict_->size() != 0;
    case Kind::kNamespace: case Kind::kCallable: return true;
  }
  return false;
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined: return "Undefined";
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kList: return list_->kind == SeqKind::kTuple ? "tuple" : "list";
    case Kind::kDict: return "dict";
    case Kind::kNamespace: return "Namespace";
    case Kind::kCallable: return "function";
  }
  return "object";
}

namespace {

std::string key_at(const Value& v, int depth) {
  if (depth > kMaxDepth) too_deep();
  switch (v.kind()) {
    case Value::Kind::kString: return "s" + v.as_string();
    case Value::Kind::kBool: case Value::Kind::kInt: return "i" + std::to_string(v.as_int());
    case Value::Kind::kFloat: {
      double f = v.as_float();
      if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 9.2e18) {
        return "i" + std::to_string(static_cast<int64_t>(f));
      }
      return "f" + python_float_repr(f);
    }
    case Value::Kind::kNone: return "n";
    case Value::Kind::kList: {
      std::string k = "t(";
      for (const auto& item : v.as_list().items) k += key_at(item, depth + 1) + ",";
      return k + ")";
    }
    default: return "?" + to_repr(v);
  }
}

}  // namespace

std::string dict_key(const Value& v) { return key_at(v, 0); }

std::string python_float_repr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  bool neg = !mant.empty() && mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant) {
    if (c != '.') digits += c;
  }
  std::string out = neg ? "-" : "";
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out += "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    } else if (static_cast<size_t>(exp) + 1 >= digits.size()) {
      out += digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char ebuf[16];
  std::snprintf(ebuf, sizeof(ebuf), "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
  return out + ebuf;
}

std::string python_string_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos;
  bool has_double = s.find('"') != std::string::npos;
  char quote = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, quote);
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      if (c == '\\') out += "\\\\";
      else if (c == static_cast<unsigned char>(quote)) { out += '\\'; out += quote; }
      else if (c == '\n') out += "\\n";
      else if (c == '\r') out += "\\r";
      else if (c == '\t') out += "\\t";
      else if (c < 0x20 || c == 0x7f) {
        char buf[8];
        std::snprintf(buf, sizeof(buf), "\\x%02x", c);
        out += buf;
      } else {
        out += static_cast<char>(c);
      }
      continue;
    }
    utf8proc_int32_t cp = 0;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                              static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {  // not UTF-8: keep the byte as it is
      out += s[i++];
      continue;
    }
    if (python_printable(cp)) {
      out.append(s, i, static_cast<size_t>(n));
    } else {
      char buf[16];
      if (cp < 0x100) std::snprintf(buf, sizeof(buf), "\\x%02x", cp);
      else if (cp < 0x10000) std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      else std::snprintf(buf, sizeof(buf), "\\U%08x", cp);
      out += buf;
    }
    i += static_cast<size_t>(n);
  }
  out += quote;
  return out;
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "";
    case Value::Kind::kString: return v.as_string();
    default: return to_repr(v);
  }
}

std::string to_repr(const Value& v) { return repr_at(v, 0); }

namespace {

std::string repr_at(const Value& v, int depth) {
  if (depth > kMaxDepth) too_deep();
  switch (v.kind()) {
    case Value::Kind::kUndefined: return "Undefined";
    case Value::Kind::kNone: return "None";
    case Value::Kind::kBool: return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt: return std::to_string(v.as_int());
    case Value::Kind::kFloat: return python_float_repr(v.as_float());
    case Value::Kind::kString: return python_string_repr(v.as_string());
    case Value::Kind::kList: return seq_repr(v.as_list(), depth);
    case Value::Kind::kDict: return dict_repr(v.as_dict(), depth);
    case Value::Kind::kNamespace: return "<Namespace " + dict_repr(v.namespace_attrs(), depth) + ">";
    case Value::Kind::kCallable: return "<function " + v.as_callable().name + ">";
  }
  return "";
}

}  // namespace

namespace {

bool equal_at(const Value& a, const Value& b, int depth) {
  if (depth > kMaxDepth) too_deep();
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() == b.as_float();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined: case Value::Kind::kNone: return true;
    case Value::Kind::kString: return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const List& x = a.as_list();
      const List& y = b.as_list();
      if ((x.kind == SeqKind::kTuple) != (y.kind == SeqKind::kTuple)) return false;
      if (x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!equal_at(x.items[i], y.items[i], depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const Dict& x = a.as_dict();
      const Dict& y = b.as_dict();
      if (x.size() != y.size()) return false;
      for (const auto& [k, v] : x.entries()) {
        const Value* other = y.find(k);
        if (!other || !equal_at(v, *other, depth + 1)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace: return &a.namespace_attrs() == &b.namespace_attrs();
    case Value::Kind::kCallable: return &a.as_callable() == &b.as_callable();
    default: return false;
  }
}

}  // namespace

bool values_equal(const Value& a, const Value& b) { return equal_at(a, b, 0); }

}  // namespace strata::tokenizer::jinja
