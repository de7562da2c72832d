#include "server/responses_api.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "server/json_guard.h"

namespace strata::server {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using Err = std::optional<ApiError>;


Err read_string(const json& o, const char* key, const std::string& field, std::string* out) {
  const json* v = find_field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) return wrong_type(field, *v, "a string");
  *out = v->get<std::string>();
  return std::nullopt;
}

Err required_string(const json& o, const char* key, const std::string& field, std::string* out) {
  const json* v = find_field(o, key);
  if (!v) return bad_field(field, field + " is required");
  if (!v->is_string()) return wrong_type(field, *v, "a string");
  *out = v->get<std::string>();
  return std::nullopt;
}

Err read_bool(const json& o, const char* key, bool* out) {
  const json* v = find_field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return wrong_type(key, *v, "a boolean");
  *out = v->get<bool>();
  return std::nullopt;
}

Err read_number(const json& o, const char* key, double lo, double hi, std::optional<float>* out) {
  const json* v = find_field(o, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return wrong_type(key, *v, "a number");
  const double d = v->get<double>();
  if (!std::isfinite(d) || d < lo || d > hi) {
    return bad_field(key, std::string(key) + " must be in [" + json(lo).dump() + ", " + json(hi).dump() + "], got " + v->dump());
  }
  *out = float(d);
  return std::nullopt;
}

// A content value: a string or text parts (input_text, output_text), joined with newlines.
Err content_text(const std::string& field, const json& v, std::string* out) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return wrong_type(field, v, "a string or an array of content parts");
  std::string text;
  for (size_t j = 0; j < v.size(); ++j) {
    const std::string pf = field + "[" + std::to_string(j) + "]";
    const json& part = v[j];
    if (!part.is_object()) return wrong_type(pf, part, "an object");
    std::string type;
    if (auto e = required_string(part, "type", pf + ".type", &type)) return e;
    std::string piece;
    if (type == "input_text" || type == "output_text" || type == "text" || type == "summary_text" ||
        type == "reasoning_text") {
      if (auto e = required_string(part, "text", pf + ".text", &piece)) return e;
    } else if (type == "refusal") {
      if (auto e = required_string(part, "refusal", pf + ".refusal", &piece)) return e;
    } else {
      return bad_field(pf + ".type", pf + ".type '" + type + "' is not supported: this server takes text parts only");
    }
    if (!text.empty()) text += "\n";
    text += piece;
  }
  *out = std::move(text);
  return std::nullopt;
}

// Input items -> chat messages. function_call items join the assistant message before them;
// a reasoning item's text becomes the next assistant message's reasoning_content.
Err parse_input(const json& input, int max_json_depth, ojson* msgs) {
  if (input.is_string()) {
    if (input.get<std::string>().empty()) return bad_field("input", "input must not be empty");
    msgs->push_back({{"role", "user"}, {"content", input.get<std::string>()}});
    return std::nullopt;
  }
  if (!input.is_array()) return wrong_type("input", input, "a string or an array of input items");
  if (input.empty()) return bad_field("input", "input must hold at least one item, got []");
  std::string reasoning;
  auto assistant = [&]() -> ojson& {
    if (msgs->empty() || msgs->back()["role"] != "assistant") msgs->push_back({{"role", "assistant"}, {"content", ""}});
    ojson& m = msgs->back();
    if (!reasoning.empty()) {
      m["reasoning_content"] = std::exchange(reasoning, std::string());
    }
    return m;
  };
  for (size_t i = 0; i < input.size(); ++i) {
    const std::string f = "input[" + std::to_string(i) + "]";
    const json& item = input[i];
    if (!item.is_object()) return wrong_type(f, item, "an object");
    std::string type;
    if (auto e = read_string(item, "type", f + ".type", &type)) return e;
    if (type.empty()) {
      if (!find_field(item, "role")) return bad_field(f + ".type", f + ".type is required (or a role for a message)");
      type = "message";
    }
    if (type == "message") {
      std::string role;
      if (auto e = required_string(item, "role", f + ".role", &role)) return e;
      if (role == "developer") role = "system";
      if (role != "user" && role != "assistant" && role != "system") {
        return bad_field(f + ".role", f + ".role '" + role + "' is not one of user, assistant, system, developer");
      }
      const json* c = find_field(item, "content");
      if (!c) return bad_field(f + ".content", f + ".content is required");
      std::string text;
      if (auto e = content_text(f + ".content", *c, &text)) return e;
      if (role == "assistant") {
        // A new assistant turn unless the one before it only holds tool calls still to come.
        if (!msgs->empty() && msgs->back()["role"] == "assistant") msgs->push_back({{"role", "assistant"}, {"content", ""}});
        ojson& m = assistant();
        m["content"] = text;
      } else {
        msgs->push_back({{"role", role}, {"content", text}});
      }
    } else if (type == "function_call") {
      std::string call_id, name, args;
      if (auto e = required_string(item, "call_id", f + ".call_id", &call_id)) return e;
      if (auto e = required_string(item, "name", f + ".name", &name)) return e;
      if (name.empty()) return bad_field(f + ".name", f + ".name must not be empty");
      if (auto e = required_string(item, "arguments", f + ".arguments", &args)) return e;
      ApiError err;
      auto parsed = parse_ordered_json_bounded(args.empty() ? std::string_view("{}") : std::string_view(args),
                                               max_json_depth, &err, f + ".arguments");
      if (!parsed) {
        err.message = (err.message.empty() ? f + ".arguments is not JSON" : err.message) + ", got " + json_excerpt(json(args));
        err.param = f + ".arguments";
        return err;
      }
      ojson& m = assistant();
      if (!m.contains("tool_calls")) m["tool_calls"] = ojson::array();
      m["tool_calls"].push_back({{"id", call_id}, {"type", "function"}, {"function", {{"name", name}, {"arguments", *parsed}}}});
    } else if (type == "function_call_output") {
      std::string call_id, output;
      if (auto e = required_string(item, "call_id", f + ".call_id", &call_id)) return e;
      const json* o = find_field(item, "output");
      if (!o) return bad_field(f + ".output", f + ".output is required");
      if (auto e = content_text(f + ".output", *o, &output)) return e;
      msgs->push_back({{"role", "tool"}, {"tool_call_id", call_id}, {"content", output}});
    } else if (type == "reasoning") {
      for (const char* key : {"content", "summary"}) {
        const json* parts = find_field(item, key);
        if (!parts) continue;
        std::string text;
        if (auto e = content_text(f + "." + key, *parts, &text)) return e;
        if (!text.empty()) {
          reasoning = text;
          break;  // the full reasoning text when given, else its summary
        }
      }
    } else {
      return bad_field(f + ".type", f + ".type '" + type +
                                        "' is not supported: input items are message, function_call, "
                                        "function_call_output and reasoning");
    }
  }
  return std::nullopt;
}

// Tools in the Responses form {type: function, name, description, parameters, strict}; the
// chat form {type: function, function: {...}} is taken too.
Err parse_tools(const json& body, ApiRequest* api, json* echo) {
  const json* tools = find_field(body, "tools");
  if (!tools) return std::nullopt;
  if (!tools->is_array()) return wrong_type("tools", *tools, "an array");
  api->tools = ojson::array();
  for (size_t i = 0; i < tools->size(); ++i) {
    const std::string f = "tools[" + std::to_string(i) + "]";
    const json& t = (*tools)[i];
    if (!t.is_object()) return wrong_type(f, t, "an object");
    std::string type;
    if (auto e = required_string(t, "type", f + ".type", &type)) return e;
    if (type != "function") {
      return bad_field(f + ".type", f + ".type '" + type + "' is not supported: only 'function' tools are");
    }
    const json* fn = find_field(t, "function");
    const json& src = fn && fn->is_object() ? *fn : t;
    const std::string pf = fn && fn->is_object() ? f + ".function" : f;
    std::string name, description;
    if (auto e = required_string(src, "name", pf + ".name", &name)) return e;
    if (name.empty()) return bad_field(pf + ".name", pf + ".name must be a non-empty string");
    if (auto e = read_string(src, "description", pf + ".description", &description)) return e;
    ojson func = {{"name", name}};
    if (!description.empty()) func["description"] = description;
    json params = nullptr;
    if (const json* p = find_field(src, "parameters")) {
      if (!p->is_object()) return wrong_type(pf + ".parameters", *p, "an object (a JSON schema)");
      func["parameters"] = ojson::parse(p->dump());
      params = *p;
    }
    bool strict = false;
    if (const json* s = find_field(src, "strict")) {
      if (!s->is_boolean()) return wrong_type(pf + ".strict", *s, "a boolean");
      strict = s->get<bool>();
    }
    api->tools.push_back({{"type", "function"}, {"function", std::move(func)}});
    (*echo)["tools"].push_back({{"type", "function"}, {"name", name}, {"description", description.empty() ? json(nullptr) : json(description)},
                                {"parameters", params}, {"strict", strict}});
    if (strict) api->strict_tools.push_back(name);
  }
  if (api->tools.empty()) api->tools = nullptr;
  return std::nullopt;
}

Err parse_tool_choice(const json& body, ApiRequest* api, json* echo) {
  const json* tc = find_field(body, "tool_choice");
  if (!tc) return std::nullopt;
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s == "auto" || s == "none") {
      api->tool_choice = s;
      (*echo)["tool_choice"] = s;
      return std::nullopt;
    }
    if (s == "required") {  // a call of one of the tools, forced by the tool-call grammar
      api->tool_choice = s;
      (*echo)["tool_choice"] = s;
      return std::nullopt;
    }
    return bad_field("tool_choice", "tool_choice must be 'auto', 'none', 'required' or a function, got '" + s + "'");
  }
  if (!tc->is_object()) return wrong_type("tool_choice", *tc, "a string or an object");
  std::string type, name;
  if (auto e = read_string(*tc, "type", "tool_choice.type", &type)) return e;
  if (auto e = read_string(*tc, "name", "tool_choice.name", &name)) return e;
  if (type == "function") {
    if (name.empty()) return bad_field("tool_choice.name", "tool_choice of type 'function' needs the function's name");
    api->tool_choice = "function";
    api->tool_choice_name = name;
    (*echo)["tool_choice"] = {{"type", "function"}, {"name", name}};
    return std::nullopt;
  }
  return bad_field("tool_choice", "tool_choice type " + json_excerpt(json(type)) + " is not supported: use 'auto' or 'none'");
}

// text.format: "text", or the Responses spelling of chat's response_format ({type: json_schema,
// name, schema, strict, description} flat, or {type: json_object}), compiled the same way.
Err parse_text_format(const json& fmt, std::optional<OutputConstraint>* out) {
  std::string type;
  if (auto e = required_string(fmt, "type", "text.format.type", &type)) return e;
  json rf;
  if (type == "text") {
    return std::nullopt;
  } else if (type == "json_object") {
    rf = {{"type", "json_object"}};
  } else if (type == "json_schema") {
    json js = json::object();
    for (const auto& [k, v] : fmt.items()) {
      if (k == "type") continue;
      if (k != "name" && k != "schema" && k != "strict" && k != "description") {
        return bad_field("text.format." + k, "text.format." + k + " is not a field of a json_schema format");
      }
      js[k] = v;
    }
    if (!js.contains("name")) return bad_field("text.format.name", "text.format of type json_schema needs a name");
    rf = {{"type", "json_schema"}, {"json_schema", std::move(js)}};
  } else {
    return bad_field("text.format.type", "text.format.type must be 'text', 'json_schema' or 'json_object', got " +
                                             json_excerpt(json(type)));
  }
  auto rename = [](std::string s) {
    for (const char* from : {"response_format.json_schema", "response_format"}) {
      for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at)) {
        s.replace(at, std::strlen(from), "text.format");
        at += std::strlen("text.format");
      }
    }
    return s;
  };
  if (auto e = parse_output_constraint(json{{"response_format", std::move(rf)}}, out)) {
    e->param = rename(e->param);
    e->message = rename(e->message);
    return e;
  }
  if (*out) (*out)->field = rename((*out)->field);
  return std::nullopt;
}

Err one_of(const json& o, const char* key, const std::string& field, std::initializer_list<const char*> allowed) {
  const json* v = find_field(o, key);
  if (!v) return std::nullopt;
  std::string list;
  for (const char* a : allowed) {
    if (v->is_string() && v->get<std::string>() == a) return std::nullopt;
    list += (list.empty() ? "'" : ", '") + std::string(a) + "'";
  }
  return bad_field(field, field + " must be one of " + list + ", got " + json_excerpt(*v));
}

}  // namespace

std::optional<ApiError> parse_responses_request(const json& body, const ParseLimits& limits, ResponsesRequest* out) {
  *out = ResponsesRequest{};
  ApiRequest& api = out->api;
  api.kind = ApiKind::kResponses;
  if (!body.is_object()) return wrong_type("body", body, "a JSON object");
  if (const json* m = find_field(body, "model")) {
    if (!m->is_string()) return wrong_type("model", *m, "a string");
    api.model = m->get<std::string>();
    if (!limits.model_names.empty() &&
        std::find(limits.model_names.begin(), limits.model_names.end(), api.model) == limits.model_names.end()) {
      ApiError e = bad_field("model", "model '" + api.model + "' does not exist; this server serves '" + limits.model_names[0] + "'");
      e.status = 404;
      e.code = "model_not_found";
      return e;
    }
  }
  json& echo = out->echo;
  echo = {{"instructions", nullptr}, {"max_output_tokens", nullptr}, {"parallel_tool_calls", true},
          {"previous_response_id", nullptr}, {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
          {"store", true}, {"temperature", nullptr}, {"text", {{"format", {{"type", "text"}}}}},
          {"tool_choice", "auto"}, {"tools", json::array()}, {"top_p", nullptr}, {"truncation", "disabled"},
          {"user", nullptr}, {"metadata", json::object()}};

  const json* input = find_field(body, "input");
  if (!input) return bad_field("input", "input is required");
  out->input = ojson::array();
  if (auto e = parse_input(*input, limits.max_json_depth, &out->input)) return e;

  if (auto e = read_string(body, "instructions", "instructions", &out->instructions)) return e;
  if (!out->instructions.empty()) echo["instructions"] = out->instructions;
  if (const json* v = find_field(body, "max_output_tokens")) {
    if (!v->is_number_integer()) return wrong_type("max_output_tokens", *v, "an integer");
    if (v->get<int64_t>() < 1 || v->get<int64_t>() > INT32_MAX) {
      return bad_field("max_output_tokens", "max_output_tokens must be at least 1, got " + v->dump());
    }
    api.max_tokens = int32_t(v->get<int64_t>());
    echo["max_output_tokens"] = *api.max_tokens;
  }
  if (auto e = read_number(body, "temperature", 0.0, 2.0, &api.temperature)) return e;
  if (auto e = read_number(body, "top_p", 0.0, 1.0, &api.top_p)) return e;
  if (api.temperature) echo["temperature"] = *api.temperature;
  if (api.top_p) echo["top_p"] = *api.top_p;
  if (auto e = read_bool(body, "stream", &api.stream)) return e;
  if (auto e = read_bool(body, "store", &out->store)) return e;
  echo["store"] = out->store;
  if (auto e = read_string(body, "previous_response_id", "previous_response_id", &out->previous_response_id)) return e;
  if (find_field(body, "previous_response_id") && out->previous_response_id.empty()) {
    return bad_field("previous_response_id", "previous_response_id must not be empty");
  }
  if (!out->previous_response_id.empty()) echo["previous_response_id"] = out->previous_response_id;
  if (auto e = parse_tools(body, &api, &echo)) return e;
  if (auto e = parse_tool_choice(body, &api, &echo)) return e;
  bool parallel = true;
  if (auto e = read_bool(body, "parallel_tool_calls", &parallel)) return e;
  echo["parallel_tool_calls"] = parallel;
  if (const json* t = find_field(body, "text")) {
    if (!t->is_object()) return wrong_type("text", *t, "an object");
    if (const json* fmt = find_field(*t, "format")) {
      if (!fmt->is_object()) return wrong_type("text.format", *fmt, "an object");
      if (auto e = parse_text_format(*fmt, &api.constraint)) return e;
      echo["text"]["format"] = *fmt;
    }
    if (auto e = one_of(*t, "verbosity", "text.verbosity", {"low", "medium", "high"})) return e;
  }
  if (const json* r = find_field(body, "reasoning")) {
    if (!r->is_object()) return wrong_type("reasoning", *r, "an object");
    if (auto e = read_reasoning_effort(*r, "effort", "reasoning.effort", &api.reasoning_effort)) return e;
    if (auto e = one_of(*r, "summary", "reasoning.summary", {"auto", "concise", "detailed"})) return e;
    if (const json* ef = find_field(*r, "effort")) echo["reasoning"]["effort"] = *ef;
    if (const json* s = find_field(*r, "summary")) echo["reasoning"]["summary"] = *s;
  }
  if (auto e = one_of(body, "truncation", "truncation", {"auto", "disabled"})) return e;
  if (const json* t = find_field(body, "truncation")) echo["truncation"] = *t;
  if (const json* md = find_field(body, "metadata")) {
    if (!md->is_object()) return wrong_type("metadata", *md, "an object");
    for (auto it = md->begin(); it != md->end(); ++it) {
      if (!it->is_string()) return wrong_type("metadata." + it.key(), *it, "a string");
    }
    echo["metadata"] = *md;
  }
  if (auto e = read_string(body, "user", "user", &api.user)) return e;
  if (!api.user.empty()) echo["user"] = api.user;
  if (const json* inc = find_field(body, "include")) {
    if (!inc->is_array()) return wrong_type("include", *inc, "an array of strings");
    for (size_t i = 0; i < inc->size(); ++i) {
      if (!(*inc)[i].is_string()) return wrong_type("include[" + std::to_string(i) + "]", (*inc)[i], "a string");
    }
  }
  bool background = false;
  if (auto e = read_bool(body, "background", &background)) return e;
  if (background) return bad_field("background", "background is not supported: send the request and wait, or stream it");
  if (find_field(body, "conversation")) return bad_field("conversation", "conversation is not supported; use previous_response_id");
  if (find_field(body, "prompt")) return bad_field("prompt", "prompt (a stored prompt template) is not supported; send input");
  if (const json* tl = find_field(body, "top_logprobs")) {
    if (!tl->is_number_integer() || tl->get<int64_t>() != 0) {
      return bad_field("top_logprobs", "top_logprobs is not supported on /v1/responses yet, got " + json_excerpt(*tl));
    }
  }
  if (auto e = read_string(body, "session_id", "session_id", &api.session_id)) return e;
  return std::nullopt;
}

std::optional<ApiError> resolve_previous_response(ResponseStore& store, ResponsesRequest* r) {
  r->conversation = ojson::array();
  if (!r->previous_response_id.empty()) {
    auto prev = store.get(r->previous_response_id);
    if (!prev) {
      ApiError e = bad_field("previous_response_id", "previous_response_id '" + r->previous_response_id +
                                                         "' is not stored here (unknown, expired or stored with store: false)");
      e.status = 404;
      e.code = "previous_response_not_found";
      return e;
    }
    r->conversation = std::move(prev->conversation);
  }
  for (const auto& m : r->input) r->conversation.push_back(m);
  r->api.messages = ojson::array();
  if (!r->instructions.empty()) r->api.messages.push_back({{"role", "system"}, {"content", r->instructions}});
  for (const auto& m : r->conversation) r->api.messages.push_back(m);
  return std::nullopt;
}

ResponsesBuilder::ResponsesBuilder(ResponseContext c, json echo) : c_(std::move(c)), echo_(std::move(echo)) {}

// Output item ids follow from the response id and the item's index, so a stream resumed under
// --supervise (which replays the same tokens) names its items as the first attempt did.
std::string ResponsesBuilder::item_id(const std::string& prefix, size_t index) const {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of "<response id>#<index>"
  for (char ch : c_.id + "#" + std::to_string(index)) h = (h ^ uint8_t(ch)) * 1099511628211ull;
  static const char* hex = "0123456789abcdef";
  std::string s = prefix;
  for (int i = 0; i < 16; ++i) s += hex[(h >> (4 * i)) & 15];
  return s;
}

json ResponsesBuilder::response_json(const std::string& status) const {
  json r = {{"id", c_.id}, {"object", "response"}, {"created_at", c_.created}, {"status", status},
            {"error", nullptr}, {"incomplete_details", incomplete_}, {"model", c_.model}, {"output", items_}};
  for (auto it = echo_.begin(); it != echo_.end(); ++it) r[it.key()] = it.value();
  r["usage"] = usage_;
  return r;
}

std::string ResponsesBuilder::event(const std::string& type, json j) const {
  j["type"] = type;
  j["sequence_number"] = seq_++;
  return sse_event(type, j);
}

std::string ResponsesBuilder::start() {
  json r = response_json("in_progress");
  std::string out = event("response.created", {{"response", r}});
  return out + event("response.in_progress", {{"response", r}});
}

std::string ResponsesBuilder::open_item(Open kind) {
  if (open_ == kind) return "";
  std::string out = close_open();
  open_ = kind;
  open_index_ = items_.size();
  json item, part;
  if (kind == Open::kMessage) {
    item = {{"id", item_id("msg_", open_index_)}, {"type", "message"}, {"status", "in_progress"}, {"role", "assistant"}, {"content", json::array()}};
    part = {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}};
  } else {
    item = {{"id", item_id("rs_", open_index_)}, {"type", "reasoning"}, {"summary", json::array()}, {"content", json::array()}};
    part = {{"type", "reasoning_text"}, {"text", ""}};
  }
  items_.push_back(item);
  out += event("response.output_item.added", {{"output_index", open_index_}, {"item", item}});
  items_[open_index_]["content"].push_back(part);
  out += event("response.content_part.added",
               {{"item_id", item["id"]}, {"output_index", open_index_}, {"content_index", 0}, {"part", part}});
  return out;
}

std::string ResponsesBuilder::close_open() {
  if (open_ == Open::kNone) return "";
  json& item = items_[open_index_];
  json& part = item["content"][0];
  std::string out;
  const bool message = open_ == Open::kMessage;
  json done = {{"item_id", item["id"]}, {"output_index", open_index_}, {"content_index", 0}, {"text", part["text"]}};
  if (message) done["logprobs"] = json::array();
  out += event(message ? "response.output_text.done" : "response.reasoning_text.done", done);
  out += event("response.content_part.done",
               {{"item_id", item["id"]}, {"output_index", open_index_}, {"content_index", 0}, {"part", part}});
  if (message) item["status"] = closing_status_;
  out += event("response.output_item.done", {{"output_index", open_index_}, {"item", item}});
  open_ = Open::kNone;
  return out;
}

std::string ResponsesBuilder::delta(const OutputDelta& d) {
  std::string out;
  if (!d.reasoning.empty()) {
    out += open_item(Open::kReasoning);
    json& item = items_[open_index_];
    item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + d.reasoning;
    out += event("response.reasoning_text.delta",
                 {{"item_id", item["id"]}, {"output_index", open_index_}, {"content_index", 0}, {"delta", d.reasoning}});
  }
  if (!d.content.empty()) {
    out += open_item(Open::kMessage);
    json& item = items_[open_index_];
    item["content"][0]["text"] = item["content"][0]["text"].get<std::string>() + d.content;
    out += event("response.output_text.delta", {{"item_id", item["id"]}, {"output_index", open_index_}, {"content_index", 0},
                                                {"delta", d.content}, {"logprobs", json::array()}});
  }
  for (const auto& t : d.tool_calls) {
    if (t.first) {
      out += close_open();
      const size_t index = items_.size();
      json item = {{"id", item_id("fc_", index)}, {"type", "function_call"}, {"status", "in_progress"},
                   {"call_id", item_id("call_", index)}, {"name", t.name}, {"arguments", ""}};
      items_.push_back(item);
      if (call_items_.size() <= size_t(t.index)) call_items_.resize(size_t(t.index) + 1, SIZE_MAX);
      call_items_[size_t(t.index)] = index;
      out += event("response.output_item.added", {{"output_index", index}, {"item", item}});
    }
    if (t.arguments.empty() || size_t(t.index) >= call_items_.size() || call_items_[size_t(t.index)] == SIZE_MAX) continue;
    const size_t index = call_items_[size_t(t.index)];
    json& item = items_[index];
    item["arguments"] = item["arguments"].get<std::string>() + t.arguments;
    out += event("response.function_call_arguments.delta", {{"item_id", item["id"]}, {"output_index", index}, {"delta", t.arguments}});
  }
  return out;
}

std::string ResponsesBuilder::finish(const OutputDelta& last, const std::vector<ToolCall>& calls, const FinishState& f) {
  const bool cut = calls.empty() && !f.stop_string && (f.reason == FinishReason::kLength || f.reason == FinishReason::kCancelled);
  std::string out = delta(last);
  closing_status_ = cut ? "incomplete" : "completed";
  out += close_open();
  for (size_t i = 0; i < call_items_.size(); ++i) {
    if (call_items_[i] == SIZE_MAX) continue;
    json& item = items_[call_items_[i]];
    // The whole parse is the authority on the arguments (the stream showed equivalent JSON).
    if (i < calls.size()) item["arguments"] = calls[i].arguments;
    item["status"] = i < calls.size() ? "completed" : "incomplete";
    out += event("response.function_call_arguments.done",
                 {{"item_id", item["id"]}, {"output_index", call_items_[i]}, {"name", item["name"]}, {"arguments", item["arguments"]}});
    out += event("response.output_item.done", {{"output_index", call_items_[i]}, {"item", item}});
  }
  status_ = cut ? "incomplete" : "completed";
  if (cut) incomplete_ = {{"reason", f.reason == FinishReason::kLength ? "max_output_tokens" : "cancelled"}};
  usage_ = {{"input_tokens", f.usage.prompt_tokens},
            {"input_tokens_details", {{"cached_tokens", f.usage.cached_tokens}}},
            {"output_tokens", f.usage.completion_tokens},
            {"output_tokens_details", {{"reasoning_tokens", 0}}},
            {"total_tokens", f.usage.prompt_tokens + f.usage.completion_tokens}};
  usage_ = with_usage_extension(std::move(usage_));
  out += event(cut ? "response.incomplete" : "response.completed", {{"response", response_json(status_)}});
  return out;
}

json ResponsesBuilder::body() const { return response_json(status_); }

std::string ResponsesBuilder::stream_error(const ApiError& e) const {
  json err = {{"code", e.code.empty() ? json(openai_error_type(e.status)) : json(e.code)},
              {"message", e.message},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)}};
  return event("error", err);
}

ojson ResponsesBuilder::assistant_message() const {
  ojson m = {{"role", "assistant"}, {"content", ""}};
  std::string text, reasoning;
  ojson calls = ojson::array();
  for (const auto& item : items_) {
    if (item["type"] == "message") {
      text += item["content"][0]["text"].get<std::string>();
    } else if (item["type"] == "reasoning") {
      reasoning += item["content"][0]["text"].get<std::string>();
    } else if (item["type"] == "function_call") {
      const std::string args = item["arguments"].get<std::string>();
      ojson parsed = ojson::parse(args, nullptr, /*allow_exceptions=*/false);
      calls.push_back({{"id", item["call_id"]}, {"type", "function"},
                       {"function", {{"name", item["name"]}, {"arguments", parsed.is_object() ? parsed : ojson(args)}}}});
    }
  }
  m["content"] = text;
  if (!reasoning.empty()) m["reasoning_content"] = reasoning;
  if (!calls.empty()) m["tool_calls"] = calls;
  return m;
}

}  // namespace strata::server
