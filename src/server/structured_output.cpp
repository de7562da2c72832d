#include "server/structured_output.h"

#include <algorithm>

#include "server/api_request.h"
#include "server/request_mapping.h"

namespace strata::server {

namespace {

using json = nlohmann::json;
using Err = std::optional<ApiError>;
using grammar::GrammarKind;

// A schema given as an object (or a boolean schema) or as its JSON text.
Err schema_text(const std::string& field, const json& v, std::string* out) {
  if (v.is_object() || v.is_boolean()) {
    *out = v.dump();
  } else if (v.is_string()) {
    *out = v.get<std::string>();
  } else {
    return wrong_type(field, v, "a JSON schema (an object, or its JSON text)");
  }
  return std::nullopt;
}

Err string_list_text(const std::string& field, const json& v, std::string* out) {
  if (!v.is_array() || v.empty()) return wrong_type(field, v, "a non-empty array of strings");
  for (size_t i = 0; i < v.size(); ++i) {
    if (!v[i].is_string()) return wrong_type(field + "[" + std::to_string(i) + "]", v[i], "a string");
  }
  *out = v.dump();
  return std::nullopt;
}

Err set(std::optional<OutputConstraint>* out, std::string field, GrammarKind kind, std::string text, bool strict = false) {
  if (*out) {
    return bad_field(field, field + " and " + (*out)->field + " both constrain the output; give only one");
  }
  OutputConstraint c;
  c.spec.kind = kind;
  c.spec.text = std::move(text);
  c.spec.json.strict = strict;
  c.field = std::move(field);
  *out = std::move(c);
  return std::nullopt;
}

Err parse_response_format(const json& rf, std::optional<OutputConstraint>* out) {
  if (!rf.is_object()) return wrong_type("response_format", rf, "an object");
  const json* t = find_field(rf, "type");
  if (!t || !t->is_string()) return bad_field("response_format.type", "response_format.type must be a string");
  const std::string type = t->get<std::string>();
  if (type == "text") return std::nullopt;
  if (type == "json_object") return set(out, "response_format", GrammarKind::kJsonObject, "");
  if (type != "json_schema") {
    return bad_field("response_format.type", "response_format.type must be 'text', 'json_object' or 'json_schema', got " +
                                                 json_excerpt(*t));
  }
  const json* js = find_field(rf, "json_schema");
  if (!js || !js->is_object()) return bad_field("response_format.json_schema", "response_format.json_schema must be an object");
  if (const json* n = find_field(*js, "name"); n && !n->is_string()) {
    return wrong_type("response_format.json_schema.name", *n, "a string");
  }
  bool strict = false;
  if (const json* s = find_field(*js, "strict"); s && !s->is_null()) {
    if (!s->is_boolean()) return wrong_type("response_format.json_schema.strict", *s, "a boolean");
    strict = s->get<bool>();
  }
  const json* schema = find_field(*js, "schema");
  if (!schema) return bad_field("response_format.json_schema.schema", "response_format.json_schema.schema is required");
  std::string text;
  if (auto e = schema_text("response_format.json_schema.schema", *schema, &text)) return e;
  return set(out, "response_format.json_schema.schema", GrammarKind::kJsonSchema, std::move(text), strict);
}

Err parse_structured_outputs(const json& so, std::optional<OutputConstraint>* out) {
  if (!so.is_object()) return wrong_type("structured_outputs", so, "an object");
  bool flexible = false;  // disable_any_whitespace: false asks for JSON whitespace between tokens
  for (auto it = so.begin(); it != so.end(); ++it) {
    const std::string k = it.key();
    const std::string f = "structured_outputs." + k;
    const json& v = it.value();
    if (v.is_null()) continue;
    std::string text;
    if (k == "json") {
      if (auto e = schema_text(f, v, &text)) return e;
      if (auto e = set(out, f, GrammarKind::kJsonSchema, std::move(text))) return e;
    } else if (k == "regex" || k == "grammar") {
      if (!v.is_string()) return wrong_type(f, v, "a string");
      if (auto e = set(out, f, k == "regex" ? GrammarKind::kRegex : GrammarKind::kEbnf, v.get<std::string>())) return e;
    } else if (k == "choice") {
      if (auto e = string_list_text(f, v, &text)) return e;
      if (auto e = set(out, f, GrammarKind::kChoice, std::move(text))) return e;
    } else if (k == "json_object") {
      if (!v.is_boolean()) return wrong_type(f, v, "a boolean");
      if (v.get<bool>()) {
        if (auto e = set(out, f, GrammarKind::kJsonObject, "")) return e;
      }
    } else if (k == "disable_any_whitespace") {
      // Compact JSON unless asked otherwise (absent or true: no whitespace; false: any).
      if (!v.is_boolean()) return wrong_type(f, v, "a boolean");
      flexible = !v.get<bool>();
    } else if (k == "disable_fallback" || k == "disable_additional_properties") {
      if (!v.is_boolean()) return wrong_type(f, v, "a boolean");  // no fallback is the default here
    } else {
      return bad_field(f, f + " is not supported: give one of json, regex, choice, grammar or json_object");
    }
  }
  if (flexible && *out && ((*out)->spec.kind == GrammarKind::kJsonSchema || (*out)->spec.kind == GrammarKind::kJsonObject)) {
    (*out)->spec.json.whitespace = grammar::JsonWhitespace::kFlexible;
  }
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_output_constraint(const json& body, std::optional<OutputConstraint>* out) {
  out->reset();
  if (const json* rf = find_field(body, "response_format")) {
    if (auto e = parse_response_format(*rf, out)) return e;
  }
  if (const json* so = find_field(body, "structured_outputs"); so && !so->is_null()) {
    if (auto e = parse_structured_outputs(*so, out)) return e;
  }
  std::string text;
  if (const json* v = find_field(body, "guided_json"); v && !v->is_null()) {
    if (auto e = schema_text("guided_json", *v, &text)) return e;
    if (auto e = set(out, "guided_json", GrammarKind::kJsonSchema, std::move(text))) return e;
  }
  for (const char* key : {"guided_regex", "guided_grammar"}) {
    if (const json* v = find_field(body, key); v && !v->is_null()) {
      if (!v->is_string()) return wrong_type(key, *v, "a string");
      const GrammarKind kind = std::string(key) == "guided_regex" ? GrammarKind::kRegex : GrammarKind::kEbnf;
      if (auto e = set(out, key, kind, v->get<std::string>())) return e;
    }
  }
  if (const json* v = find_field(body, "guided_choice"); v && !v->is_null()) {
    if (auto e = string_list_text("guided_choice", *v, &text)) return e;
    if (auto e = set(out, "guided_choice", GrammarKind::kChoice, std::move(text))) return e;
  }
  return std::nullopt;
}

std::optional<ApiError> forced_tool_call_constraint(const ApiRequest& r, ToolCallFormat format, OutputConstraint* out) {
  const std::string what = r.tool_choice == "function" ? "tool_choice naming '" + r.tool_choice_name + "'"
                                                       : "tool_choice '" + r.tool_choice + "'";
  std::string args_key, prefix, suffix;
  switch (format) {
    case ToolCallFormat::kHermes:
      args_key = "arguments";
      prefix = "<tool_call>\n";
      suffix = "\n</tool_call>";
      break;
    case ToolCallFormat::kLlama3:
      args_key = "parameters";
      break;
    default:
      return bad_field("tool_choice", what + " forces a call in the model's tool-call format, and this model's format (" +
                                          tool_call_format_name(format) + ") has none strata can force (hermes, llama3)");
  }
  // Ordered, so the name comes first (a stream shows the call's name before its arguments).
  using ojson = nlohmann::ordered_json;
  ojson any = ojson::array();
  bool strict = true;
  for (const auto& t : r.tools) {
    const auto& fn = t["function"];
    const std::string name = fn["name"].get<std::string>();
    if (r.tool_choice == "function" && name != r.tool_choice_name) continue;
    ojson props = ojson::object();
    props["name"] = ojson{{"const", name}};
    props[args_key] = fn.contains("parameters") ? fn["parameters"] : ojson{{"type", "object"}};
    ojson call = ojson::object();
    call["type"] = "object";
    call["properties"] = std::move(props);
    call["required"] = ojson::array({"name", args_key});
    call["additionalProperties"] = false;
    any.push_back(std::move(call));
    strict = strict && std::find(r.strict_tools.begin(), r.strict_tools.end(), name) != r.strict_tools.end();
  }
  if (any.empty()) return bad_field("tool_choice", what + " matches no tool");
  out->spec.kind = GrammarKind::kJsonSchema;
  out->spec.text = any.size() == 1 ? any[0].dump() : ojson{{"anyOf", any}}.dump();
  out->spec.json.strict = strict;
  out->spec.json.prefix = prefix;
  out->spec.json.suffix = suffix;
  out->field = "tool_choice";
  return std::nullopt;
}

std::optional<ApiError> attach_constraint(const OutputConstraint& c, const ServedModel& m, GenerationRequest* g) {
  if (!m.grammars || !m.grammar_vocab) {
    return bad_field(c.field, c.field + ": constrained decoding needs the model's tokenizer vocabulary, which model '" + m.name +
                                  "' was served without");
  }
  auto masks = m.grammars->get_masks(c.spec, m.grammar_vocab);
  if (!masks.ok()) {
    const std::string& msg = masks.error().message;
    ApiError e = bad_field(c.field, c.field + ": " + msg);
    if (masks.error().code == ErrorCode::kResourceExhausted) e.message += " (the grammar is past the server's limits)";
    return e;
  }
  g->grammar = *masks;
  g->grammar_key = grammar::GrammarCache::key_of(c.spec);
  return std::nullopt;
}

}  // namespace strata::server
