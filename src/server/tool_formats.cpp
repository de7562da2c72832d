#include "server/tool_formats.h"

#include <algorithm>
#include <cctype>

#include "server/json_guard.h"

namespace strata::server {

namespace {

using ojson = nlohmann::ordered_json;

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim_view(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// The type a property schema declares: "type" as a string, the first non-null of a type list,
// or the first typed branch of anyOf / oneOf.
std::string schema_type(const ojson& s) {
  if (!s.is_object()) return "";
  if (auto t = s.find("type"); t != s.end()) {
    if (t->is_string()) return lower(t->get<std::string>());
    if (t->is_array()) {
      for (const auto& e : *t) {
        if (e.is_string() && e.get<std::string>() != "null") return lower(e.get<std::string>());
      }
    }
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    if (auto a = s.find(key); a != s.end() && a->is_array()) {
      for (const auto& branch : *a) {
        const std::string t = schema_type(branch);
        if (!t.empty() && t != "null") return t;
      }
    }
  }
  if (s.contains("enum")) return "string";
  return "";
}

}  // namespace

ToolParamTypes tool_param_types(const nlohmann::ordered_json& tools) {
  ToolParamTypes out;
  if (!tools.is_array()) return out;
  for (const auto& t : tools) {
    if (!t.is_object()) continue;
    const ojson* fn = &t;
    if (auto f = t.find("function"); f != t.end() && f->is_object()) fn = &*f;
    auto name = fn->find("name");
    if (name == fn->end() || !name->is_string()) continue;
    auto& params = out[name->get<std::string>()];
    auto schema = fn->find("parameters");
    if (schema == fn->end() || !schema->is_object()) continue;
    auto props = schema->find("properties");
    if (props == schema->end() || !props->is_object()) continue;
    for (auto it = props->begin(); it != props->end(); ++it) params[it.key()] = schema_type(it.value());
  }
  return out;
}

std::string declared_param_type(const ToolParamTypes* types, const std::string& tool, const std::string& param) {
  if (!types) return "";
  auto t = types->find(tool);
  if (t == types->end()) return "";
  auto p = t->second.find(param);
  return p == t->second.end() ? "" : p->second;
}

std::string_view xml_param_text(std::string_view raw) {
  if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
  if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
  return raw;
}

bool xml_type_is_text(const std::string& type) {
  return type.empty() || type == "string" || type == "str" || type == "text" || type == "enum";
}

std::string dump_json(const ojson& v) { return v.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ojson xml_param_value(std::string_view raw, const std::string& type) {
  const ojson text(std::string{raw});
  if (xml_type_is_text(type)) return text;
  const std::string_view v = trim_view(raw);
  if (lower(v) == "null") return nullptr;
  if (type == "boolean" || type == "bool") {
    const std::string l = lower(v);
    if (l == "true" || l == "false") return l == "true";
    return text;
  }
  const auto parsed = parse_ordered_json_bounded(v, kDefaultMaxJsonDepth);
  if (!parsed) return text;
  if (type == "integer" || type == "int") return parsed->is_number_integer() ? *parsed : text;
  if (type == "number" || type == "float") return parsed->is_number() ? *parsed : text;
  if (type == "object") return parsed->is_object() ? *parsed : text;
  if (type == "array") return parsed->is_array() ? *parsed : text;
  return *parsed;  // a type this server does not know: JSON when the text is JSON
}

Scan gemma4_key(std::string_view t, size_t* p, std::string* out) {
  size_t q = *p;
  while (q < t.size() && is_space(t[q])) ++q;
  if (q >= t.size()) return Scan::kMore;
  if (t.substr(q, kGemmaQuote.size()) == kGemmaQuote) {
    const size_t close = t.find(kGemmaQuote, q + kGemmaQuote.size());
    if (close == std::string_view::npos) return Scan::kMore;
    *out = std::string(t.substr(q + kGemmaQuote.size(), close - q - kGemmaQuote.size()));
    q = close + kGemmaQuote.size();
    while (q < t.size() && is_space(t[q])) ++q;
    if (q >= t.size()) return Scan::kMore;
    if (t[q] != ':') return Scan::kBad;
  } else {
    const size_t colon = t.find_first_of(":,{}[]<", q);
    if (colon == std::string_view::npos) return Scan::kMore;
    if (t[colon] != ':') return Scan::kBad;
    *out = std::string(trim_view(t.substr(q, colon - q)));
    if (out->empty()) return Scan::kBad;
    q = colon;
  }
  *p = q + 1;
  return Scan::kDone;
}

Scan gemma4_value(std::string_view t, size_t* p, ojson* out, int depth) {
  if (depth > kDefaultMaxJsonDepth) return Scan::kBad;
  size_t q = *p;
  while (q < t.size() && is_space(t[q])) ++q;
  if (q >= t.size()) return Scan::kMore;
  // A string: the text between two quote tokens, as it is (the template does not escape it).
  if (t.substr(q, kGemmaQuote.size()) == kGemmaQuote) {
    const size_t close = t.find(kGemmaQuote, q + kGemmaQuote.size());
    if (close == std::string_view::npos) return Scan::kMore;
    *out = std::string(t.substr(q + kGemmaQuote.size(), close - q - kGemmaQuote.size()));
    *p = close + kGemmaQuote.size();
    return Scan::kDone;
  }
  if (kGemmaQuote.substr(0, t.size() - q) == t.substr(q)) return Scan::kMore;  // a quote token, cut
  if (t[q] == '{' || t[q] == '[') {
    const bool object = t[q] == '{';
    const char close = object ? '}' : ']';
    *out = object ? ojson::object() : ojson::array();
    ++q;
    for (bool first = true;; first = false) {
      while (q < t.size() && is_space(t[q])) ++q;
      if (q >= t.size()) return Scan::kMore;
      if (t[q] == close) {
        *p = q + 1;
        return Scan::kDone;
      }
      if (!first) {
        if (t[q] != ',') return Scan::kBad;
        ++q;
      }
      std::string key;
      if (object) {
        if (const Scan s = gemma4_key(t, &q, &key); s != Scan::kDone) return s;
      }
      ojson v;
      if (const Scan s = gemma4_value(t, &q, &v, depth + 1); s != Scan::kDone) return s;
      if (object) (*out)[key] = std::move(v);
      else out->push_back(std::move(v));
    }
  }
  // A JSON string, which some renderings use for a string.
  if (t[q] == '"') {
    bool escaped = false;
    for (size_t i = q + 1; i < t.size(); ++i) {
      if (escaped) escaped = false;
      else if (t[i] == '\\') escaped = true;
      else if (t[i] == '"') {
        const ojson s = ojson::parse(t.substr(q, i + 1 - q), nullptr, /*allow_exceptions=*/false);
        if (!s.is_string()) return Scan::kBad;
        *out = s;
        *p = i + 1;
        return Scan::kDone;
      }
    }
    return Scan::kMore;
  }
  // A bare scalar runs to the next separator; it is complete only once one follows.
  const size_t end = t.find_first_of(",}]", q);
  if (end == std::string_view::npos) return Scan::kMore;
  const std::string_view word = trim_view(t.substr(q, end - q));
  if (word.empty()) return Scan::kBad;
  if (word == "true" || word == "false") *out = word == "true";
  else if (word == "null" || word == "None") *out = nullptr;
  else if (const auto n = parse_ordered_json_bounded(word, 1); n && n->is_number()) *out = *n;
  else *out = std::string(word);
  *p = end;
  return Scan::kDone;
}

}  // namespace strata::server
