#include "tokenizer/jinja/json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "tokenizer/jinja/failure.h"
#include "tokenizer/jinja/operators.h"
#include "tokenizer/jinja/text.h"

namespace strata::tokenizer::jinja {

namespace {

// Nesting bound for dumping: namespaces can be made to contain themselves.
constexpr int kMaxJsonDepth = kMaxDepth;

void dump_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (uint32_t cp : decode_utf8(s)) {
    switch (cp) {
      case '"': out += "\\\""; continue;
      case '\\': out += "\\\\"; continue;
      case '\n': out += "\\n"; continue;
      case '\r': out += "\\r"; continue;
      case '\t': out += "\\t"; continue;
      case '\b': out += "\\b"; continue;
      case '\f': out += "\\f"; continue;
      default: break;
    }
    char buf[16];
    if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
      if (cp >= 0x10000) {
        uint32_t v = cp - 0x10000;
        std::snprintf(buf, sizeof(buf), "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", cp);
      }
      out += buf;
    } else {
      append_utf8(out, cp);
    }
  }
  out += '"';
}

std::string key_text(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString: return k.as_string();
    case Value::Kind::kBool: return k.as_bool() ? "true" : "false";
    case Value::Kind::kInt: return std::to_string(k.as_int());
    case Value::Kind::kFloat: return python_float_repr(k.as_float());
    case Value::Kind::kNone: return "null";
    default: fail("TypeError: keys must be str, int, float, bool or None, not " + k.type_name());
  }
}

void newline(std::string& out, const JsonDumpOptions& o, int depth) {
  if (!o.indent) return;
  out += '\n';
  for (int i = 0; i < depth; ++i) out += *o.indent;
}

void dump(std::string& out, const Value& v, const JsonDumpOptions& o, int depth) {
  if (depth > kMaxJsonDepth) fail("ValueError: Circular reference detected");
  switch (v.kind()) {
    case Value::Kind::kNone: out += "null"; return;
    case Value::Kind::kBool: out += v.as_bool() ? "true" : "false"; return;
    case Value::Kind::kInt: out += std::to_string(v.as_int()); return;
    case Value::Kind::kFloat: {
      double f = v.as_float();
      if (std::isnan(f)) out += "NaN";
      else if (std::isinf(f)) out += f > 0 ? "Infinity" : "-Infinity";
      else out += python_float_repr(f);
      return;
    }
    case Value::Kind::kString: dump_string(out, v.as_string(), o.ensure_ascii); return;
    case Value::Kind::kList: {
      const auto& items = v.as_list().items;
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += o.item_separator;
        newline(out, o, depth + 1);
        dump(out, items[i], o, depth + 1);
      }
      newline(out, o, depth);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [k, val] : v.as_dict().entries()) entries.emplace_back(key_text(k), &val);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      if (entries.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += o.item_separator;
        newline(out, o, depth + 1);
        dump_string(out, entries[i].first, o.ensure_ascii);
        out += o.key_separator;
        dump(out, *entries[i].second, o, depth + 1);
      }
      newline(out, o, depth);
      out += '}';
      return;
    }
    default:
      fail("TypeError: Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

namespace {

Value from_json_at(const nlohmann::ordered_json& j, int depth) {
  if (depth > kMaxDepth) fail("context nests deeper than " + std::to_string(kMaxDepth) + " levels");
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return Value::none();
    case nlohmann::ordered_json::value_t::boolean: return Value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return Value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return Value(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return Value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      std::vector<Value> items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json_at(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      auto d = std::make_shared<Dict>();
      for (auto it = j.begin(); it != j.end(); ++it) d->set(Value(it.key()), from_json_at(it.value(), depth + 1));
      return Value::dict(std::move(d));
    }
    default:
      return Value::none();
  }
}

}  // namespace

Value from_json(const nlohmann::ordered_json& j) { return from_json_at(j, 0); }

std::string dump_json(const Value& v, const JsonDumpOptions& options) {
  std::string out;
  dump(out, v, options, 0);
  return out;
}

}  // namespace strata::tokenizer::jinja
