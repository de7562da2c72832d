#include "server/api_request.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "server/json_guard.h"

namespace strata::server {

namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;
using Err = std::optional<ApiError>;


Err read_bool(const json& body, const char* key, bool* out) {
  const json* v = find_field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_boolean()) return wrong_type(key, *v, "a boolean");
  *out = v->get<bool>();
  return std::nullopt;
}

Err as_int(const std::string& field, const json& v, int64_t lo, int64_t hi, int64_t* out) {
  if (v.is_number_integer()) {
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
      return bad_field(field, field + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
    }
    *out = v.get<int64_t>();
  } else if (v.is_number_float() && std::isfinite(v.get<double>()) && v.get<double>() == std::floor(v.get<double>()) &&
             std::fabs(v.get<double>()) < 9e15) {
    *out = int64_t(v.get<double>());
  } else {
    return wrong_type(field, v, "an integer");
  }
  if (*out < lo || *out > hi) {
    return bad_field(field, field + " must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + v.dump());
  }
  return std::nullopt;
}

template <class T>
Err read_int(const json& body, const char* key, int64_t lo, int64_t hi, std::optional<T>* out) {
  const json* v = find_field(body, key);
  if (!v) return std::nullopt;
  int64_t x = 0;
  if (auto e = as_int(key, *v, lo, hi, &x)) return e;
  *out = T(x);
  return std::nullopt;
}

Err read_float(const json& body, const char* key, std::optional<float>* out) {
  const json* v = find_field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_number()) return wrong_type(key, *v, "a number");
  const double d = v->get<double>();
  if (!std::isfinite(d) || std::fabs(d) > 1e30) return bad_field(key, std::string(key) + " must be a finite number, got " + v->dump());
  *out = float(d);
  return std::nullopt;
}

// A temperature in [0, hi]: OpenAI's range is [0, 2], Anthropic's [0, 1].
Err read_temperature(const json& body, int hi, std::optional<float>* out) {
  if (auto e = read_float(body, "temperature", out)) return e;
  if (*out && !(**out >= 0.0f && **out <= float(hi))) {
    return bad_field("temperature", "temperature must be in [0, " + std::to_string(hi) + "], got " +
                                        find_field(body, "temperature")->dump());
  }
  return std::nullopt;
}

Err read_string(const json& body, const char* key, std::string* out) {
  const json* v = find_field(body, key);
  if (!v) return std::nullopt;
  if (!v->is_string()) return wrong_type(key, *v, "a string");
  *out = v->get<std::string>();
  return std::nullopt;
}

Err check_model(const json& body, const ParseLimits& limits, bool required, std::string* out) {
  const json* v = find_field(body, "model");
  if (!v) {
    if (required) return bad_field("model", "model is required");
    return std::nullopt;
  }
  if (!v->is_string()) return wrong_type("model", *v, "a string");
  *out = v->get<std::string>();
  if (!limits.model_names.empty() &&
      std::find(limits.model_names.begin(), limits.model_names.end(), *out) == limits.model_names.end()) {
    ApiError e = bad_field("model", "model '" + *out + "' does not exist; this server serves '" + limits.model_names[0] + "'");
    e.status = 404;
    e.code = "model_not_found";
    return e;
  }
  return std::nullopt;
}

// Text of a content value: a string or a list of text parts (joined with newlines).
Err content_text(const std::string& field, const json& v, bool allow_null, std::string* out, bool* was_null) {
  if (was_null) *was_null = false;
  if (v.is_null()) {
    if (!allow_null) return bad_field(field, field + " must not be null");
    if (was_null) *was_null = true;
    return std::nullopt;
  }
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
    const json* type = find_field(part, "type");
    if (!type || !type->is_string()) return bad_field(pf + ".type", pf + ".type must be a string");
    const std::string t = type->get<std::string>();
    if (t != "text") {
      return bad_field(pf + ".type", pf + ".type '" + t + "' is not supported: this server takes text parts only");
    }
    const json* tx = find_field(part, "text");
    if (!tx || !tx->is_string()) return bad_field(pf + ".text", pf + ".text must be a string");
    if (!text.empty()) text += "\n";
    text += tx->get<std::string>();
  }
  *out = std::move(text);
  return std::nullopt;
}

// Tool-call arguments reach chat templates as objects (they write them with tojson); a string
// that is not a JSON object stays a string.
Err arguments_value(const std::string& s, const std::string& field, int max_depth, ojson* out) {
  if (auto e = check_json_text(s, max_depth, field)) {
    e->param = field;
    return e;
  }
  ojson parsed = ojson::parse(s, nullptr, /*allow_exceptions=*/false);
  *out = !parsed.is_discarded() && parsed.is_object() ? std::move(parsed) : ojson(s);
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> read_reasoning_effort(const json& o, const char* key, const std::string& field, std::string* out) {
  const json* v = find_field(o, key);
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_string()) return wrong_type(field, *v, "a string");
  const std::string s = v->get<std::string>();
  for (const char* a : kReasoningEfforts) {
    if (s == a) {
      *out = s;
      return std::nullopt;
    }
  }
  return bad_field(field, field + " must be one of 'none', 'minimal', 'low', 'medium', 'high', 'xhigh', got " + json_excerpt(*v));
}

namespace {

Err parse_openai_messages(const json& body, int max_json_depth, ApiRequest* out) {
  const json* msgs = find_field(body, "messages");
  if (!msgs) return bad_field("messages", "messages is required");
  if (!msgs->is_array()) return wrong_type("messages", *msgs, "an array");
  if (msgs->empty()) return bad_field("messages", "messages must hold at least one message, got []");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const std::string f = "messages[" + std::to_string(i) + "]";
    const json& m = (*msgs)[i];
    if (!m.is_object()) return wrong_type(f, m, "an object");
    const json* role_v = find_field(m, "role");
    if (!role_v) return bad_field(f + ".role", f + ".role is required");
    if (!role_v->is_string()) return wrong_type(f + ".role", *role_v, "a string");
    std::string role = role_v->get<std::string>();
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return bad_field(f + ".role", f + ".role '" + role + "' is not one of system, developer, user, assistant, tool");
    }
    ojson msg = {{"role", role}};
    const json* tool_calls = find_field(m, "tool_calls");
    const bool may_be_null = role == "assistant" && tool_calls != nullptr;
    std::string text;
    bool was_null = false;
    auto cit = m.find("content");
    if (cit == m.end()) {
      if (!may_be_null) return bad_field(f + ".content", f + ".content is required");
      was_null = true;
    } else if (auto e = content_text(f + ".content", *cit, may_be_null, &text, &was_null)) {
      return e;
    }
    // A null content (an assistant turn that only calls tools) reaches templates as "", as
    // they test it with `in` and string filters (Qwen3's does `'</think>' in content`).
    msg["content"] = was_null ? ojson("") : ojson(text);
    if (const json* name = find_field(m, "name")) {
      if (!name->is_string()) return wrong_type(f + ".name", *name, "a string");
      msg["name"] = name->get<std::string>();
    }
    if (role == "tool") {
      if (const json* id = find_field(m, "tool_call_id")) {
        if (!id->is_string()) return wrong_type(f + ".tool_call_id", *id, "a string");
        msg["tool_call_id"] = id->get<std::string>();
      }
    }
    if (role == "assistant") {
      if (const json* rc = find_field(m, "reasoning_content")) {
        if (!rc->is_string()) return wrong_type(f + ".reasoning_content", *rc, "a string");
        msg["reasoning_content"] = rc->get<std::string>();
      }
    }
    if (tool_calls) {
      if (role != "assistant") return bad_field(f + ".tool_calls", f + ".tool_calls is only allowed on assistant messages");
      if (!tool_calls->is_array()) return wrong_type(f + ".tool_calls", *tool_calls, "an array");
      ojson calls = ojson::array();
      for (size_t k = 0; k < tool_calls->size(); ++k) {
        const std::string tf = f + ".tool_calls[" + std::to_string(k) + "]";
        const json& c = (*tool_calls)[k];
        if (!c.is_object()) return wrong_type(tf, c, "an object");
        const json* fn = find_field(c, "function");
        if (!fn || !fn->is_object()) return bad_field(tf + ".function", tf + ".function must be an object");
        const json* name = find_field(*fn, "name");
        if (!name || !name->is_string()) return bad_field(tf + ".function.name", tf + ".function.name must be a string");
        ojson args = ojson::object();
        if (const json* a = find_field(*fn, "arguments")) {
          if (a->is_string()) {
            if (auto e = arguments_value(a->get<std::string>(), tf + ".function.arguments", max_json_depth, &args)) return e;
          }
          else if (a->is_object()) args = ojson::parse(a->dump());
          else return wrong_type(tf + ".function.arguments", *a, "a JSON string");
        }
        ojson call = {{"type", "function"}, {"function", {{"name", name->get<std::string>()}, {"arguments", args}}}};
        if (const json* id = find_field(c, "id"); id && id->is_string()) call["id"] = id->get<std::string>();
        calls.push_back(std::move(call));
      }
      msg["tool_calls"] = std::move(calls);
    }
    out->messages.push_back(std::move(msg));
  }
  return std::nullopt;
}

Err parse_openai_tools(const json& body, ApiRequest* out) {
  const json* tools = find_field(body, "tools");
  if (tools) {
    if (!tools->is_array()) return wrong_type("tools", *tools, "an array");
    out->tools = ojson::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string f = "tools[" + std::to_string(i) + "]";
      const json& t = (*tools)[i];
      if (!t.is_object()) return wrong_type(f, t, "an object");
      const json* type = find_field(t, "type");
      if (type && (!type->is_string() || type->get<std::string>() != "function")) {
        return bad_field(f + ".type", f + ".type " + json_excerpt(*type) + " is not supported: only 'function' tools are");
      }
      const json* fn = find_field(t, "function");
      if (!fn || !fn->is_object()) return bad_field(f + ".function", f + ".function must be an object");
      const json* name = find_field(*fn, "name");
      if (!name || !name->is_string() || name->get<std::string>().empty()) {
        return bad_field(f + ".function.name", f + ".function.name must be a non-empty string");
      }
      ojson func = {{"name", name->get<std::string>()}};
      if (const json* d = find_field(*fn, "description")) {
        if (!d->is_string()) return wrong_type(f + ".function.description", *d, "a string");
        func["description"] = d->get<std::string>();
      }
      if (const json* p = find_field(*fn, "parameters")) {
        if (!p->is_object()) return wrong_type(f + ".function.parameters", *p, "an object (a JSON schema)");
        func["parameters"] = ojson::parse(p->dump());
      }
      if (const json* st = find_field(*fn, "strict"); st && !st->is_null()) {
        if (!st->is_boolean()) return wrong_type(f + ".function.strict", *st, "a boolean");
        if (st->get<bool>()) out->strict_tools.push_back(name->get<std::string>());
      }
      out->tools.push_back({{"type", "function"}, {"function", std::move(func)}});
    }
    if (out->tools.empty()) out->tools = nullptr;
  }
  const json* tc = find_field(body, "tool_choice");
  if (!tc) return std::nullopt;
  if (tc->is_string()) {
    const std::string s = tc->get<std::string>();
    if (s != "none" && s != "auto" && s != "required") {
      return bad_field("tool_choice", "tool_choice must be 'none', 'auto', 'required' or a function, got '" + s + "'");
    }
    out->tool_choice = s;
  } else if (tc->is_object()) {
    const json* fn = find_field(*tc, "function");
    const json* name = fn && fn->is_object() ? find_field(*fn, "name") : nullptr;
    if (!name || !name->is_string()) return bad_field("tool_choice", "tool_choice.function.name must be a string");
    out->tool_choice = "function";
    out->tool_choice_name = name->get<std::string>();
  } else {
    return wrong_type("tool_choice", *tc, "a string or an object");
  }
  if (out->tool_choice != "none" && out->tool_choice != "auto" && out->tools.is_null()) {
    return bad_field("tool_choice", "tool_choice '" + out->tool_choice + "' needs tools");
  }
  if (out->tool_choice == "function") {
    bool found = false;
    for (const auto& t : out->tools) found = found || t["function"]["name"] == out->tool_choice_name;
    if (!found) return bad_field("tool_choice", "tool_choice names function '" + out->tool_choice_name + "', which is not in tools");
  }
  return std::nullopt;
}

Err parse_stop(const json& body, const char* key, std::vector<std::string>* out) {
  const json* v = find_field(body, key);
  if (!v) return std::nullopt;
  std::vector<std::string> stops;
  if (v->is_string()) {
    stops.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) {
      if (!(*v)[i].is_string()) return wrong_type(std::string(key) + "[" + std::to_string(i) + "]", (*v)[i], "a string");
      stops.push_back((*v)[i].get<std::string>());
    }
  } else {
    return wrong_type(key, *v, "a string or an array of strings");
  }
  if (stops.size() > 16) return bad_field(key, std::string(key) + " holds " + std::to_string(stops.size()) + " strings; at most 16 are allowed");
  for (const auto& s : stops) {
    if (s.empty()) return bad_field(key, std::string(key) + " must not hold an empty string");
  }
  *out = std::move(stops);
  return std::nullopt;
}

// Fields the chat and completions endpoints share.
Err parse_openai_common(const json& body, ApiRequest* out) {
  std::optional<int32_t> max_tokens, max_completion_tokens;
  if (auto e = read_int(body, "max_tokens", INT32_MIN, INT32_MAX, &max_tokens)) return e;
  if (auto e = read_int(body, "max_completion_tokens", INT32_MIN, INT32_MAX, &max_completion_tokens)) return e;
  if (max_completion_tokens) max_tokens = max_completion_tokens;
  const char* mt_name = max_completion_tokens ? "max_completion_tokens" : "max_tokens";
  if (max_tokens && *max_tokens <= 0) {
    return bad_field(mt_name, std::string(mt_name) + " must be at least 1, got " + std::to_string(*max_tokens));
  }
  out->max_tokens = max_tokens;
  if (auto e = read_temperature(body, 2, &out->temperature)) return e;
  if (auto e = read_float(body, "top_p", &out->top_p)) return e;
  if (auto e = read_float(body, "min_p", &out->min_p)) return e;
  if (auto e = read_float(body, "repetition_penalty", &out->repetition_penalty)) return e;
  if (auto e = read_int(body, "top_k", -1, INT32_MAX, &out->top_k)) return e;
  if (out->top_k && *out->top_k < 0) out->top_k = 0;  // -1: off, as vLLM spells it
  if (auto e = read_bool(body, "return_tokens_as_token_ids", &out->tokens_as_ids)) return e;
  std::optional<float> pp, fp;
  if (auto e = read_float(body, "presence_penalty", &pp)) return e;
  if (auto e = read_float(body, "frequency_penalty", &fp)) return e;
  out->presence_penalty = pp.value_or(0.0f);
  out->frequency_penalty = fp.value_or(0.0f);
  if (const json* s = find_field(body, "seed")) {
    int64_t v = 0;
    if (auto e = as_int("seed", *s, std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(), &v)) return e;
    out->seed = uint64_t(v);
  }
  if (auto e = parse_stop(body, "stop", &out->stop)) return e;
  if (const json* ids = find_field(body, "stop_token_ids")) {
    if (!ids->is_array()) return wrong_type("stop_token_ids", *ids, "an array of token ids");
    for (size_t i = 0; i < ids->size(); ++i) {
      int64_t v = 0;
      if (auto e = as_int("stop_token_ids[" + std::to_string(i) + "]", (*ids)[i], 0, INT32_MAX, &v)) return e;
      out->stop_token_ids.push_back(int32_t(v));
    }
  }
  if (const json* lb = find_field(body, "logit_bias")) {
    if (!lb->is_object()) return wrong_type("logit_bias", *lb, "an object of token id -> bias");
    for (auto it = lb->begin(); it != lb->end(); ++it) {
      const std::string f = "logit_bias[\"" + it.key() + "\"]";
      size_t used = 0;
      long long id = -1;
      try {
        id = std::stoll(it.key(), &used);
      } catch (const std::exception&) {
        used = 0;
      }
      if (used == 0 || used != it.key().size() || id < 0 || id > INT32_MAX) {
        return bad_field("logit_bias", "logit_bias key '" + it.key() + "' is not a token id");
      }
      if (!it->is_number()) return wrong_type(f, *it, "a number");
      const double b = it->get<double>();
      if (!(b >= -100.0 && b <= 100.0)) return bad_field("logit_bias", f + " must be in [-100, 100], got " + it->dump());
      out->logit_bias.emplace_back(int32_t(id), float(b));
    }
  }
  if (auto e = read_bool(body, "ignore_eos", &out->ignore_eos)) return e;
  if (auto e = read_bool(body, "speculative", &out->speculative)) return e;
  if (auto e = read_bool(body, "skip_special_tokens", &out->skip_special_tokens)) return e;
  if (auto e = read_bool(body, "stream", &out->stream)) return e;
  if (const json* so = find_field(body, "stream_options")) {
    if (!so->is_object()) return wrong_type("stream_options", *so, "an object");
    if (!out->stream) return bad_field("stream_options", "stream_options is only allowed when stream is true");
    if (auto e = read_bool(*so, "include_usage", &out->include_usage)) {
      e->param = "stream_options.include_usage";
      e->message = "stream_options." + e->message;
      return e;
    }
  }
  std::optional<int32_t> n;
  if (auto e = read_int(body, "n", 1, kMaxChoices, &n)) return e;
  out->n = n.value_or(1);
  if (auto e = parse_output_constraint(body, &out->constraint)) return e;
  std::optional<int32_t> priority;
  if (auto e = read_int(body, "priority", INT32_MIN, INT32_MAX, &priority)) return e;
  out->priority = priority.value_or(0);
  if (auto e = read_string(body, "session_id", &out->session_id)) return e;
  if (auto e = read_string(body, "user", &out->user)) return e;
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> parse_chat_request(const json& body, const ParseLimits& limits, ApiRequest* out) {
  *out = ApiRequest{};
  out->kind = ApiKind::kChat;
  if (!body.is_object()) return wrong_type("body", body, "a JSON object");
  if (auto e = check_model(body, limits, false, &out->model)) return e;
  if (auto e = parse_openai_messages(body, limits.max_json_depth, out)) return e;
  if (auto e = parse_openai_common(body, out)) return e;
  if (auto e = parse_openai_tools(body, out)) return e;
  if (find_field(body, "functions")) return bad_field("functions", "functions is not supported; use tools");
  if (const json* mods = find_field(body, "modalities")) {
    if (!mods->is_array()) return wrong_type("modalities", *mods, "an array");
    for (const auto& m : *mods) {
      if (!m.is_string() || m.get<std::string>() != "text") {
        return bad_field("modalities", "modalities " + json_excerpt(m) + " is not supported: only 'text' is");
      }
    }
  }
  if (find_field(body, "audio")) return bad_field("audio", "audio output is not supported");
  bool logprobs = false;
  if (auto e = read_bool(body, "logprobs", &logprobs)) return e;
  std::optional<int32_t> top;
  if (auto e = read_int(body, "top_logprobs", 0, 20, &top)) return e;
  if (top && !logprobs) return bad_field("top_logprobs", "top_logprobs needs logprobs set to true");
  if (logprobs) out->logprobs = top.value_or(0);
  if (const json* kw = find_field(body, "chat_template_kwargs")) {
    if (!kw->is_object()) return wrong_type("chat_template_kwargs", *kw, "an object");
    out->chat_template_kwargs = ojson::parse(kw->dump());
  }
  if (auto e = read_reasoning_effort(body, "reasoning_effort", "reasoning_effort", &out->reasoning_effort)) return e;
  return std::nullopt;
}

std::optional<ApiError> parse_completion_request(const json& body, const ParseLimits& limits, ApiRequest* out) {
  *out = ApiRequest{};
  out->kind = ApiKind::kCompletion;
  if (!body.is_object()) return wrong_type("body", body, "a JSON object");
  if (auto e = check_model(body, limits, false, &out->model)) return e;
  const json* p = find_field(body, "prompt");
  if (!p) return bad_field("prompt", "prompt is required");
  auto read_ids = [&](const json& arr, const std::string& field) -> Err {
    if (arr.empty()) return bad_field("prompt", field + " must hold at least one token id, got []");
    for (size_t i = 0; i < arr.size(); ++i) {
      int64_t v = 0;
      if (auto e = as_int(field + "[" + std::to_string(i) + "]", arr[i], 0, INT32_MAX, &v)) {
        e->param = "prompt";
        return e;
      }
      out->prompt_ids.push_back(int32_t(v));
    }
    out->prompt_is_ids = true;
    return std::nullopt;
  };
  if (p->is_string()) {
    out->prompt_text = p->get<std::string>();
  } else if (p->is_array()) {
    if (p->empty()) return bad_field("prompt", "prompt must not be an empty array");
    const json& first = (*p)[0];
    if (first.is_number()) {
      if (auto e = read_ids(*p, "prompt")) return e;
    } else if (first.is_string() || first.is_array()) {
      if (p->size() != 1) {
        return bad_field("prompt", "prompt holds a batch of " + std::to_string(p->size()) + " prompts; send one prompt per request");
      }
      if (first.is_string()) out->prompt_text = first.get<std::string>();
      else if (auto e = read_ids(first, "prompt[0]")) return e;
    } else {
      return wrong_type("prompt[0]", first, "a string, a token id or an array of token ids");
    }
  } else {
    return wrong_type("prompt", *p, "a string or an array of token ids");
  }
  if (!out->prompt_is_ids && out->prompt_text.empty()) return bad_field("prompt", "prompt must not be empty");
  if (auto e = parse_openai_common(body, out)) return e;
  if (auto e = read_bool(body, "echo", &out->echo)) return e;
  std::optional<int32_t> lp;
  if (auto e = read_int(body, "logprobs", 0, 20, &lp)) return e;
  if (lp) out->logprobs = *lp;
  std::optional<int32_t> best_of;
  if (auto e = read_int(body, "best_of", 1, kMaxChoices, &best_of)) return e;
  if (best_of) {
    if (*best_of < out->n) {
      return bad_field("best_of", "best_of must be at least n (" + std::to_string(out->n) + "), got " + std::to_string(*best_of));
    }
    // As vLLM: the candidates are ranked only once all have ended, so nothing can stream.
    if (out->stream && *best_of > 1) return bad_field("best_of", "best_of " + std::to_string(*best_of) + " cannot be used with stream");
    out->best_of = *best_of;
  }
  std::string suffix;
  if (auto e = read_string(body, "suffix", &suffix)) return e;
  if (!suffix.empty()) return bad_field("suffix", "suffix is not supported (no fill-in-the-middle)");
  return std::nullopt;
}

std::optional<ApiError> parse_messages_request(const json& body, const ParseLimits& limits, ApiRequest* out) {
  *out = ApiRequest{};
  out->kind = ApiKind::kMessages;
  if (!body.is_object()) return wrong_type("body", body, "a JSON object");
  if (auto e = check_model(body, limits, false, &out->model)) return e;
  if (!find_field(body, "max_tokens")) return bad_field("max_tokens", "max_tokens is required");
  if (auto e = read_int(body, "max_tokens", INT32_MIN, INT32_MAX, &out->max_tokens)) return e;
  if (*out->max_tokens <= 0) return bad_field("max_tokens", "max_tokens must be at least 1, got " + std::to_string(*out->max_tokens));
  if (const json* sys = find_field(body, "system")) {
    std::string text;
    if (auto e = content_text("system", *sys, false, &text, nullptr)) return e;
    out->messages.push_back({{"role", "system"}, {"content", text}});
  }
  const json* msgs = find_field(body, "messages");
  if (!msgs) return bad_field("messages", "messages is required");
  if (!msgs->is_array()) return wrong_type("messages", *msgs, "an array");
  if (msgs->empty()) return bad_field("messages", "messages must hold at least one message, got []");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const std::string f = "messages[" + std::to_string(i) + "]";
    const json& m = (*msgs)[i];
    if (!m.is_object()) return wrong_type(f, m, "an object");
    const json* role_v = find_field(m, "role");
    if (!role_v || !role_v->is_string()) return bad_field(f + ".role", f + ".role must be 'user' or 'assistant'");
    const std::string role = role_v->get<std::string>();
    if (role != "user" && role != "assistant") {
      return bad_field(f + ".role", f + ".role '" + role + "' is not one of user, assistant");
    }
    const json* content = find_field(m, "content");
    if (!content) return bad_field(f + ".content", f + ".content is required");
    if (content->is_string()) {
      out->messages.push_back({{"role", role}, {"content", content->get<std::string>()}});
      continue;
    }
    if (!content->is_array()) return wrong_type(f + ".content", *content, "a string or an array of content blocks");
    std::string text, thinking;
    ojson calls = ojson::array();
    std::vector<ojson> tool_results;
    for (size_t j = 0; j < content->size(); ++j) {
      const std::string bf = f + ".content[" + std::to_string(j) + "]";
      const json& b = (*content)[j];
      if (!b.is_object()) return wrong_type(bf, b, "an object");
      const json* type = find_field(b, "type");
      if (!type || !type->is_string()) return bad_field(bf + ".type", bf + ".type must be a string");
      const std::string t = type->get<std::string>();
      if (t == "text") {
        const json* tx = find_field(b, "text");
        if (!tx || !tx->is_string()) return bad_field(bf + ".text", bf + ".text must be a string");
        if (!text.empty()) text += "\n";
        text += tx->get<std::string>();
      } else if (t == "thinking" && role == "assistant") {
        const json* th = find_field(b, "thinking");
        if (th && th->is_string()) thinking += th->get<std::string>();
      } else if (t == "redacted_thinking" && role == "assistant") {
      } else if (t == "tool_use" && role == "assistant") {
        const json* name = find_field(b, "name");
        if (!name || !name->is_string()) return bad_field(bf + ".name", bf + ".name must be a string");
        ojson input = ojson::object();
        if (const json* in = find_field(b, "input")) {
          if (!in->is_object()) return wrong_type(bf + ".input", *in, "an object");
          input = ojson::parse(in->dump());
        }
        ojson call = {{"type", "function"}, {"function", {{"name", name->get<std::string>()}, {"arguments", input}}}};
        if (const json* id = find_field(b, "id"); id && id->is_string()) call["id"] = id->get<std::string>();
        calls.push_back(std::move(call));
      } else if (t == "tool_result" && role == "user") {
        std::string result;
        if (const json* c = find_field(b, "content")) {
          if (auto e = content_text(bf + ".content", *c, false, &result, nullptr)) return e;
        }
        ojson msg = {{"role", "tool"}, {"content", result}};
        if (const json* id = find_field(b, "tool_use_id"); id && id->is_string()) msg["tool_call_id"] = id->get<std::string>();
        tool_results.push_back(std::move(msg));
      } else {
        return bad_field(bf + ".type", bf + ".type '" + t + "' is not supported in a " + role + " message");
      }
    }
    for (auto& r : tool_results) out->messages.push_back(std::move(r));
    if (role == "assistant") {
      ojson msg = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) msg["reasoning_content"] = thinking;
      if (!calls.empty()) msg["tool_calls"] = std::move(calls);
      out->messages.push_back(std::move(msg));
    } else if (!text.empty() || tool_results.empty()) {
      out->messages.push_back({{"role", "user"}, {"content", text}});
    }
  }
  if (auto e = parse_stop(body, "stop_sequences", &out->stop)) return e;
  if (auto e = read_temperature(body, 1, &out->temperature)) return e;
  if (auto e = read_float(body, "top_p", &out->top_p)) return e;
  if (auto e = read_int(body, "top_k", -1, INT32_MAX, &out->top_k)) return e;
  if (out->top_k && *out->top_k < 0) out->top_k = 0;
  if (auto e = read_bool(body, "stream", &out->stream)) return e;
  out->include_usage = true;
  if (const json* tools = find_field(body, "tools")) {
    if (!tools->is_array()) return wrong_type("tools", *tools, "an array");
    out->tools = ojson::array();
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string f = "tools[" + std::to_string(i) + "]";
      const json& t = (*tools)[i];
      if (!t.is_object()) return wrong_type(f, t, "an object");
      if (const json* type = find_field(t, "type"); type && (!type->is_string() || type->get<std::string>() != "custom")) {
        return bad_field(f + ".type", f + ".type " + json_excerpt(*type) + " is not supported: only client tools are");
      }
      const json* name = find_field(t, "name");
      if (!name || !name->is_string() || name->get<std::string>().empty()) {
        return bad_field(f + ".name", f + ".name must be a non-empty string");
      }
      ojson func = {{"name", name->get<std::string>()}};
      if (const json* d = find_field(t, "description")) {
        if (!d->is_string()) return wrong_type(f + ".description", *d, "a string");
        func["description"] = d->get<std::string>();
      }
      if (const json* s = find_field(t, "input_schema")) {
        if (!s->is_object()) return wrong_type(f + ".input_schema", *s, "an object (a JSON schema)");
        func["parameters"] = ojson::parse(s->dump());
      }
      out->tools.push_back({{"type", "function"}, {"function", std::move(func)}});
    }
    if (out->tools.empty()) out->tools = nullptr;
  }
  if (const json* tc = find_field(body, "tool_choice")) {
    if (!tc->is_object()) return wrong_type("tool_choice", *tc, "an object");
    const json* type = find_field(*tc, "type");
    const std::string t = type && type->is_string() ? type->get<std::string>() : "";
    if (t == "auto" || t == "none") out->tool_choice = t;
    else if (t == "any") out->tool_choice = "required";
    else if (t == "tool") {
      const json* name = find_field(*tc, "name");
      if (!name || !name->is_string()) return bad_field("tool_choice", "tool_choice.name must be a string");
      out->tool_choice = "function";
      out->tool_choice_name = name->get<std::string>();
    } else {
      return bad_field("tool_choice", "tool_choice.type must be 'auto', 'any', 'tool' or 'none', got " +
                                          (type ? json_excerpt(*type) : std::string("nothing")));
    }
    if (out->tool_choice != "none" && out->tool_choice != "auto" && out->tools.is_null()) {
      return bad_field("tool_choice", "tool_choice '" + t + "' needs tools");
    }
  }
  if (const json* th = find_field(body, "thinking")) {
    if (!th->is_object()) return wrong_type("thinking", *th, "an object");
    const json* type = find_field(*th, "type");
    if (!type || !type->is_string() || (type->get<std::string>() != "enabled" && type->get<std::string>() != "disabled")) {
      return bad_field("thinking", "thinking.type must be 'enabled' or 'disabled'");
    }
    out->chat_template_kwargs["enable_thinking"] = type->get<std::string>() == "enabled";
  }
  if (const json* md = find_field(body, "metadata"); md && !md->is_null()) {
    if (!md->is_object()) return wrong_type("metadata", *md, "an object");
    if (const json* uid = find_field(*md, "user_id"); uid && !uid->is_null()) {
      if (!uid->is_string()) return wrong_type("metadata.user_id", *uid, "a string");
      out->user = uid->get<std::string>();
    }
  }
  if (auto e = read_string(body, "session_id", &out->session_id)) return e;
  std::optional<int32_t> priority;
  if (auto e = read_int(body, "priority", INT32_MIN, INT32_MAX, &priority)) return e;
  out->priority = priority.value_or(0);
  return std::nullopt;
}

}  // namespace strata::server
