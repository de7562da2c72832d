#include "tokenizer/jinja/operators.h"

#include <cmath>
#include <limits>

#include "tokenizer/jinja/failure.h"
#include "tokenizer/jinja/methods.h"
#include "tokenizer/jinja/text.h"

namespace strata::tokenizer::jinja {

namespace {

const char* op_symbol(BinaryOp op) {
  switch (op) {
    case BinaryOp::kAdd: return "+";
    case BinaryOp::kSub: return "-";
    case BinaryOp::kMul: return "*";
    case BinaryOp::kDiv: return "/";
    case BinaryOp::kFloorDiv: return "//";
    case BinaryOp::kMod: return "%";
    case BinaryOp::kPow: return "** or pow()";
    default: return "?";
  }
}

[[noreturn]] void fail_operands(BinaryOp op, const Value& a, const Value& b) {
  fail(std::string("TypeError: unsupported operand type(s) for ") + op_symbol(op) + ": '" + a.type_name() +
       "' and '" + b.type_name() + "'");
}

// jinja2's object_type_repr: how an Undefined names the object it came from.
std::string object_type_repr(const Value& obj) {
  if (obj.is_none()) return "None";
  return obj.type_name() + " object";
}

Value missing_attr(const Value& obj, const std::string& name) {
  return Value::undefined("'" + object_type_repr(obj) + "' has no attribute '" + name + "'");
}

Value checked_int(__int128 v) {
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min()) {
    fail("OverflowError: integer result out of the 64-bit range");
  }
  return Value(static_cast<int64_t>(v));
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value repeat(const Value& seq, int64_t n) {
  if (n < 0) n = 0;
  if (seq.is_string()) {
    const std::string& s = seq.as_string();
    if (!s.empty() && static_cast<uint64_t>(n) > kMaxBuiltSize / s.size()) fail("MemoryError: repeated string is too large");
    std::string out;
    out.reserve(s.size() * static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) out += s;
    return Value(std::move(out));
  }
  const List& l = seq.as_list();
  if (!l.items.empty() && static_cast<uint64_t>(n) > kMaxBuiltSize / l.items.size()) fail("MemoryError: repeated list is too large");
  std::vector<Value> out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), l.items.begin(), l.items.end());
  return Value::list(std::move(out), l.kind == SeqKind::kTuple ? SeqKind::kTuple : SeqKind::kList);
}

bool is_plain_seq(const Value& v, SeqKind kind) {
  return v.is_list() && v.as_list().kind == kind;
}

// Python slice.indices(): the positions a[start:stop:step] selects from a sequence of n.
std::vector<int64_t> slice_positions(int64_t n, const Value& start, const Value& stop, const Value& step) {
  auto as_index = [](const Value& v, const char* what) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) fail(std::string("TypeError: slice ") + what + " must be an integer or None");
    return v.as_int();
  };
  int64_t st = as_index(step, "step").value_or(1);
  if (st == 0) fail("ValueError: slice step cannot be zero");
  auto b = as_index(start, "start");
  auto e = as_index(stop, "stop");
  int64_t lo, hi;
  if (st > 0) {
    lo = b ? (*b < 0 ? std::max<int64_t>(*b + n, 0) : std::min(*b, n)) : 0;
    hi = e ? (*e < 0 ? std::max<int64_t>(*e + n, 0) : std::min(*e, n)) : n;
  } else {
    lo = b ? (*b < 0 ? std::max<int64_t>(*b + n, -1) : std::min(*b, n - 1)) : n - 1;
    hi = e ? (*e < 0 ? std::max<int64_t>(*e + n, -1) : std::min(*e, n - 1)) : -1;
  }
  std::vector<int64_t> out;
  if (st > 0) {
    for (int64_t i = lo; i < hi; i += st) out.push_back(i);
  } else {
    for (int64_t i = lo; i > hi; i += st) out.push_back(i);
  }
  return out;
}

}  // namespace

[[noreturn]] void fail_undefined(const Value& v) {
  const std::string& hint = v.undefined_hint();
  fail("UndefinedError: " + (hint.empty() ? std::string("value is undefined") : hint));
}

Value binary_op(BinaryOp op, const Value& a, const Value& b) {
  if (op == BinaryOp::kConcat) return Value(to_str(a) + to_str(b));
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  bool nums = a.is_number() && b.is_number();
  bool any_float = a.is_float() || b.is_float();
  switch (op) {
    case BinaryOp::kAdd:
      if (nums) return any_float ? Value(a.as_float() + b.as_float()) : checked_int(static_cast<__int128>(a.as_int()) + b.as_int());
      if (a.is_string() && b.is_string()) {
        if (a.as_string().size() + b.as_string().size() > kMaxBuiltSize) fail("MemoryError: string is too large");
        return Value(a.as_string() + b.as_string());
      }
      if (a.is_string()) fail("TypeError: can only concatenate str (not \"" + b.type_name() + "\") to str");
      if (a.is_list() && b.is_list()) {
        bool at = is_plain_seq(a, SeqKind::kTuple);
        bool bt = is_plain_seq(b, SeqKind::kTuple);
        if (at != bt || (!at && (!is_plain_seq(a, SeqKind::kList) || !is_plain_seq(b, SeqKind::kList)))) {
          fail("TypeError: can only concatenate " + a.type_name() + " (not \"" + b.type_name() + "\") to " + a.type_name());
        }
        std::vector<Value> items = a.as_list().items;
        items.insert(items.end(), b.as_list().items.begin(), b.as_list().items.end());
        return Value::list(std::move(items), at ? SeqKind::kTuple : SeqKind::kList);
      }
      fail_operands(op, a, b);
    case BinaryOp::kSub:
      if (nums) return any_float ? Value(a.as_float() - b.as_float()) : checked_int(static_cast<__int128>(a.as_int()) - b.as_int());
      fail_operands(op, a, b);
    case BinaryOp::kMul:
      if (nums) return any_float ? Value(a.as_float() * b.as_float()) : checked_int(static_cast<__int128>(a.as_int()) * b.as_int());
      if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool())) return repeat(a, b.as_int());
      if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool())) return repeat(b, a.as_int());
      if (a.is_string() || b.is_string()) fail("TypeError: can't multiply sequence by non-int of type '" + (a.is_string() ? b : a).type_name() + "'");
      fail_operands(op, a, b);
    case BinaryOp::kDiv:
      if (!nums) fail_operands(op, a, b);
      if (b.as_float() == 0.0) fail("ZeroDivisionError: division by zero");
      return Value(a.as_float() / b.as_float());
    case BinaryOp::kFloorDiv:
      if (!nums) fail_operands(op, a, b);
      if (b.as_float() == 0.0) fail("ZeroDivisionError: integer division or modulo by zero");
      if (any_float) return Value(std::floor(a.as_float() / b.as_float()));
      if (a.as_int() == std::numeric_limits<int64_t>::min() && b.as_int() == -1) fail("OverflowError: integer result out of the 64-bit range");
      return Value(floor_div(a.as_int(), b.as_int()));
    case BinaryOp::kMod:
      if (a.is_string()) return Value(percent_format(a.as_string(), b));
      if (!nums) fail_operands(op, a, b);
      if (b.as_float() == 0.0) fail("ZeroDivisionError: integer division or modulo by zero");
      if (any_float) {
        double x = a.as_float(), y = b.as_float();
        double m = std::fmod(x, y);
        if (m != 0.0 && ((m < 0) != (y < 0))) m += y;
        return Value(m);
      }
      if (b.as_int() == -1) return Value(int64_t{0});
      return Value(a.as_int() - floor_div(a.as_int(), b.as_int()) * b.as_int());
    case BinaryOp::kPow:
      if (!nums) fail_operands(op, a, b);
      if (!any_float && b.as_int() >= 0) {
        __int128 result = 1;
        __int128 base = a.as_int();
        int64_t e = b.as_int();
        while (e > 0) {
          if (e & 1) result = checked_int(result * base).as_int();
          e >>= 1;
          if (e > 0) base = checked_int(base * base).as_int();
        }
        return Value(static_cast<int64_t>(result));
      }
      if (a.as_float() == 0.0 && b.as_float() < 0) fail("ZeroDivisionError: 0.0 cannot be raised to a negative power");
      return Value(std::pow(a.as_float(), b.as_float()));
    default:
      fail("internal error: bad binary operator");
  }
}

Value negate(const Value& v, bool negative) {
  if (v.is_undefined()) fail_undefined(v);
  if (!v.is_number()) fail(std::string("TypeError: bad operand type for unary ") + (negative ? "-" : "+") + ": '" + v.type_name() + "'");
  if (!negative) return v.is_bool() ? Value(v.as_int()) : v;
  if (v.is_float()) return Value(-v.as_float());
  return checked_int(-static_cast<__int128>(v.as_int()));
}

namespace {

bool less_at(const Value& a, const Value& b, int depth) {
  if (depth > kMaxDepth) fail("RecursionError: maximum recursion depth exceeded in comparison");
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_float() < b.as_float();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 order is code-point order
  if (a.is_list() && b.is_list() && (a.as_list().kind == SeqKind::kTuple) == (b.as_list().kind == SeqKind::kTuple)) {
    const auto& x = a.as_list().items;
    const auto& y = b.as_list().items;
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!values_equal(x[i], y[i])) return less_at(x[i], y[i], depth + 1);
    }
    return x.size() < y.size();
  }
  fail("TypeError: '<' not supported between instances of '" + a.type_name() + "' and '" + b.type_name() + "'");
}

}  // namespace

bool value_less(const Value& a, const Value& b) { return less_at(a, b, 0); }

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined: return false;
    case Value::Kind::kString:
      if (!item.is_string()) fail("TypeError: 'in <string>' requires string as left operand, not " + item.type_name());
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const auto& v : container.as_list().items) {
        if (values_equal(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict: return container.as_dict().find(item) != nullptr;
    default:
      fail("TypeError: argument of type '" + container.type_name() + "' is not iterable");
  }
}

bool compare_op(CompareOp op, const Value& a, const Value& b) {
  switch (op) {
    case CompareOp::kEq: return values_equal(a, b);
    case CompareOp::kNe: return !values_equal(a, b);
    case CompareOp::kLt: return value_less(a, b);
    case CompareOp::kGt: return value_less(b, a);
    case CompareOp::kLe: return values_equal(a, b) ? (value_less(a, b), true) : value_less(a, b);
    case CompareOp::kGe: return values_equal(a, b) ? (value_less(b, a), true) : value_less(b, a);
    case CompareOp::kIn: return contains(b, a);
    case CompareOp::kNotIn: return !contains(b, a);
  }
  return false;
}

Value get_attr(const Value& obj, const std::string& name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: fail_undefined(obj);
    case Value::Kind::kNamespace: {
      const Value* v = obj.namespace_attrs().find(name);
      return v ? *v : missing_attr(obj, name);
    }
    case Value::Kind::kDict: {
      if (auto m = find_method(obj, name)) return *m;
      const Value* v = obj.as_dict().find(name);
      return v ? *v : missing_attr(obj, name);
    }
    default:
      if (auto m = find_method(obj, name)) return *m;
      return missing_attr(obj, name);
  }
}

Value get_item(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined: fail_undefined(obj);
    case Value::Kind::kDict: {
      const Value* v = obj.as_dict().find(key);
      if (v) return *v;
      break;
    }
    case Value::Kind::kList:
    case Value::Kind::kString: {
      if (!key.is_int() && !key.is_bool()) break;
      int64_t i = key.as_int();
      if (obj.is_list()) {
        int64_t n = static_cast<int64_t>(obj.as_list().items.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.as_list().items[static_cast<size_t>(i)];
      } else {
        std::vector<uint32_t> cps = decode_utf8(obj.as_string());
        int64_t n = static_cast<int64_t>(cps.size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) {
          std::string out;
          append_utf8(out, cps[static_cast<size_t>(i)]);
          return Value(std::move(out));
        }
      }
      return Value::undefined(object_type_repr(obj) + " has no element " + to_repr(key));
    }
    default:
      break;
  }
  if (key.is_string()) {
    if (obj.is_namespace()) {
      const Value* v = obj.namespace_attrs().find(key.as_string());
      if (v) return *v;
    }
    if (auto m = find_method(obj, key.as_string())) return *m;
    return missing_attr(obj, key.as_string());
  }
  return Value::undefined(object_type_repr(obj) + " has no element " + to_repr(key));
}

Value slice_value(const Value& obj, const Value& start, const Value& stop, const Value& step) {
  if (obj.is_undefined()) fail_undefined(obj);
  if (obj.is_list()) {
    const auto& items = obj.as_list().items;
    std::vector<Value> out;
    for (int64_t i : slice_positions(static_cast<int64_t>(items.size()), start, stop, step)) out.push_back(items[static_cast<size_t>(i)]);
    SeqKind kind = obj.as_list().kind == SeqKind::kTuple ? SeqKind::kTuple : SeqKind::kList;
    return Value::list(std::move(out), kind);
  }
  if (obj.is_string()) {
    std::vector<uint32_t> cps = decode_utf8(obj.as_string());
    std::vector<uint32_t> out;
    for (int64_t i : slice_positions(static_cast<int64_t>(cps.size()), start, stop, step)) out.push_back(cps[static_cast<size_t>(i)]);
    return Value(encode_utf8(out));
  }
  return Value::undefined(object_type_repr(obj) + " has no element slice");
}

std::vector<Value> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return {};
    case Value::Kind::kList: return v.as_list().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, _] : v.as_dict().entries()) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      for (uint32_t cp : decode_utf8(v.as_string())) {
        std::string s;
        append_utf8(s, cp);
        chars.emplace_back(std::move(s));
      }
      return chars;
    }
    default:
      fail("TypeError: '" + v.type_name() + "' object is not iterable");
  }
}

int64_t length_of(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined: return 0;
    case Value::Kind::kString: return static_cast<int64_t>(codepoint_length(v.as_string()));
    case Value::Kind::kList: return static_cast<int64_t>(v.as_list().items.size());
    case Value::Kind::kDict: return static_cast<int64_t>(v.as_dict().size());
    default:
      fail("TypeError: object of type '" + v.type_name() + "' has no len()");
  }
}

}  // namespace strata::tokenizer::jinja
