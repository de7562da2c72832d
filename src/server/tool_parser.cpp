#include "server/tool_parser.h"

#include <cctype>
#include <utility>

#include <nlohmann/json.hpp>

#include "server/json_guard.h"
#include "server/stop_matcher.h"
#include "server/tool_formats.h"

namespace strata::server {

namespace {

using ojson = nlohmann::ordered_json;


// The markers that open the first call of each format: the filter holds text back from there.
std::vector<std::string_view> call_markers(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kHermes: return {kHermesOpen};
    case ToolCallFormat::kDeepSeek: return {kDsCallsBegin, kDsCallBegin};
    case ToolCallFormat::kQwen3Coder: return {kHermesOpen, kXmlFunction};
    case ToolCallFormat::kMistral: return {kMistralCalls};
    case ToolCallFormat::kGemma4: return {kGemmaCall};
    default: return {};
  }
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// {"name": ..., "arguments"|"parameters": {...}} -> a call; false when it is not one.
bool call_from_json(const ojson& j, ToolCall* out) {
  if (!j.is_object()) return false;
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) return false;
  out->name = name->get<std::string>();
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  if (args == j.end() || args->is_null()) {
    out->arguments = "{}";
  } else if (args->is_object()) {
    out->arguments = args->dump();
  } else if (args->is_string()) {
    const auto parsed = parse_ordered_json_bounded(args->get<std::string>(), kDefaultMaxJsonDepth);
    if (!parsed || !parsed->is_object()) return false;
    out->arguments = parsed->dump();
  } else {
    return false;
  }
  return true;
}

bool parse_json_call(std::string_view text, ToolCall* out) {
  const auto parsed = parse_ordered_json_bounded(text, kDefaultMaxJsonDepth);
  return parsed && call_from_json(*parsed, out);
}

// End (exclusive) of the JSON object or array starting at text[0] ('{' or '['); npos when it
// never closes. Brackets of both kinds count, so nested containers of either kind balance.
size_t json_container_end(std::string_view text) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') ++depth;
    else if ((c == ']' || c == '}') && --depth == 0) return i + 1;
  }
  return std::string_view::npos;
}

ToolParse parse_hermes(std::string_view text) {
  ToolParse r;
  size_t first = text.find(kHermesOpen);
  if (first == std::string_view::npos) {
    r.content = std::string(text);
    return r;
  }
  std::string content(text.substr(0, first));
  size_t pos = first;
  while (pos != std::string_view::npos) {
    const size_t body = pos + kHermesOpen.size();
    const size_t close = text.find(kHermesClose, body);
    const std::string_view inner = text.substr(body, close == std::string_view::npos ? std::string_view::npos : close - body);
    ToolCall call;
    if (!parse_json_call(trim(inner), &call)) return ToolParse{std::string(text), {}};
    r.calls.push_back(std::move(call));
    if (close == std::string_view::npos) break;
    const size_t after = close + kHermesClose.size();
    pos = text.find(kHermesOpen, after);
    content += trim(text.substr(after, pos == std::string_view::npos ? std::string_view::npos : pos - after));
  }
  r.content = trim(content);
  return r;
}

ToolParse parse_llama3(std::string_view text) {
  std::string_view t = text;
  size_t b = 0;
  while (b < t.size() && std::isspace(static_cast<unsigned char>(t[b]))) ++b;
  t.remove_prefix(b);
  if (t.substr(0, kPythonTag.size()) == kPythonTag) t.remove_prefix(kPythonTag.size());
  ToolParse r;
  for (;;) {
    size_t s = 0;
    while (s < t.size() && (std::isspace(static_cast<unsigned char>(t[s])) || (t[s] == ';' && !r.calls.empty()))) ++s;
    t.remove_prefix(s);
    if (t.empty()) break;
    if (t[0] != '{') return ToolParse{std::string(text), {}};
    const size_t end = json_container_end(t);
    if (end == std::string_view::npos) return ToolParse{std::string(text), {}};
    ToolCall call;
    if (!parse_json_call(t.substr(0, end), &call)) return ToolParse{std::string(text), {}};
    r.calls.push_back(std::move(call));
    t.remove_prefix(end);
  }
  if (r.calls.empty()) r.content = std::string(text);
  return r;
}

ToolParse parse_deepseek(std::string_view text) {
  ToolParse r;
  size_t begin = text.find(kDsCallsBegin);
  size_t pos = begin == std::string_view::npos ? text.find(kDsCallBegin) : begin;
  if (pos == std::string_view::npos) {
    r.content = std::string(text);
    return r;
  }
  r.content = trim(text.substr(0, pos));
  for (;;) {
    const size_t cb = text.find(kDsCallBegin, pos);
    if (cb == std::string_view::npos) break;
    const size_t body = cb + kDsCallBegin.size();
    size_t ce = text.find(kDsCallEnd, body);
    const std::string_view inner = text.substr(body, ce == std::string_view::npos ? std::string_view::npos : ce - body);
    const size_t sep = inner.find(kDsSep);
    if (sep == std::string_view::npos) return ToolParse{std::string(text), {}};
    const std::string left = trim(inner.substr(0, sep));
    std::string_view right = inner.substr(sep + kDsSep.size());
    ToolCall call;
    std::string args;
    const size_t fence = right.find("```");
    if (left == "function" && fence != std::string_view::npos) {
      call.name = trim(right.substr(0, fence));
      std::string_view a = right.substr(fence + 3);
      if (a.substr(0, 4) == "json") a.remove_prefix(4);
      const size_t close = a.rfind("```");
      args = trim(a.substr(0, close));
    } else {
      call.name = left;
      args = trim(right);
    }
    if (call.name.empty()) return ToolParse{std::string(text), {}};
    const auto parsed = parse_ordered_json_bounded(args.empty() ? std::string_view("{}") : std::string_view(args),
                                                   kDefaultMaxJsonDepth);
    if (!parsed || !parsed->is_object()) return ToolParse{std::string(text), {}};
    call.arguments = parsed->dump();
    r.calls.push_back(std::move(call));
    if (ce == std::string_view::npos) break;
    pos = ce + kDsCallEnd.size();
  }
  if (r.calls.empty()) return ToolParse{std::string(text), {}};
  return r;
}


// Content around calls: the pieces joined, each trimmed, as parse_hermes does.
void add_content(std::string* content, std::string_view piece) {
  std::string t = trim(piece);
  if (!t.empty()) {
    if (!content->empty()) *content += "\n";
    *content += t;
  }
}

// One <function=NAME>...</function> block from text[pos] (at "<function="); *end is past it.
bool parse_xml_function(std::string_view text, size_t pos, const ToolParamTypes* types, ToolCall* out, size_t* end) {
  const size_t name_at = pos + kXmlFunction.size();
  const size_t gt = text.find('>', name_at);
  if (gt == std::string_view::npos) return false;
  out->name = trim(text.substr(name_at, gt - name_at));
  if (out->name.empty() || out->name.find('<') != std::string::npos) return false;
  size_t close = text.find(kXmlFunctionEnd, gt);
  // A call cut off by the token limit still ends at its </tool_call> or at the end of the text.
  const size_t body_end = close != std::string_view::npos ? close : std::min(text.find(kHermesClose, gt), text.size());
  *end = close != std::string_view::npos ? close + kXmlFunctionEnd.size() : body_end;
  const std::string_view body = text.substr(gt + 1, body_end - gt - 1);
  ojson args = ojson::object();
  size_t p = body.find(kXmlParam);
  while (p != std::string_view::npos) {
    const size_t key_at = p + kXmlParam.size();
    const size_t kgt = body.find('>', key_at);
    if (kgt == std::string_view::npos) return false;
    const std::string key = trim(body.substr(key_at, kgt - key_at));
    if (key.empty()) return false;
    // A value ends at its </parameter>; one the model left open ends at the next parameter.
    size_t vend = body.find(kXmlParamEnd, kgt);
    const size_t next = body.find(kXmlParam, kgt);
    if (vend == std::string_view::npos || (next != std::string_view::npos && next < vend)) vend = std::min(next, body.size());
    const std::string_view raw = xml_param_text(body.substr(kgt + 1, vend - kgt - 1));
    args[key] = xml_param_value(raw, declared_param_type(types, out->name, key));
    p = body.find(kXmlParam, vend);
  }
  out->arguments = dump_json(args);
  return true;
}

ToolParse parse_qwen3_xml(std::string_view text, const ToolParamTypes* types) {
  const size_t first = text.find(kXmlFunction);
  // Qwen3-Coder at times falls back to the JSON body of the Qwen family's earlier models.
  if (first == std::string_view::npos) return parse_hermes(text);
  ToolParse r;
  // The <tool_call> around the first function (when there is one) is not content.
  size_t head = text.rfind(kHermesOpen, first);
  if (head == std::string_view::npos || trim(text.substr(head + kHermesOpen.size(), first - head - kHermesOpen.size())) != "") {
    head = first;
  }
  add_content(&r.content, text.substr(0, head));
  size_t pos = first;
  while (pos != std::string_view::npos) {
    ToolCall call;
    size_t end = 0;
    if (!parse_xml_function(text, pos, types, &call, &end)) return ToolParse{std::string(text), {}};
    r.calls.push_back(std::move(call));
    const size_t next = text.find(kXmlFunction, end);
    std::string between(text.substr(end, next == std::string_view::npos ? std::string_view::npos : next - end));
    for (std::string_view tag : {kHermesClose, kHermesOpen}) {
      for (size_t t = between.find(tag); t != std::string::npos; t = between.find(tag)) between.erase(t, tag.size());
    }
    add_content(&r.content, between);
    pos = next;
  }
  return r;
}


ToolParse parse_mistral(std::string_view text) {
  size_t pos = text.find(kMistralCalls);
  if (pos == std::string_view::npos) return ToolParse{std::string(text), {}};
  ToolParse r;
  add_content(&r.content, text.substr(0, pos));
  while (pos != std::string_view::npos) {
    std::string_view t = text.substr(pos + kMistralCalls.size());
    size_t b = 0;
    while (b < t.size() && std::isspace(static_cast<unsigned char>(t[b]))) ++b;
    t.remove_prefix(b);
    size_t used = 0;  // bytes of t the call(s) took
    if (!t.empty() && t[0] == '[') {
      // [{"name": ..., "arguments": {...}, "id": ...}, ...]
      const size_t end = json_container_end(t);
      if (end == std::string_view::npos) return ToolParse{std::string(text), {}};
      const auto list = parse_ordered_json_bounded(t.substr(0, end), kDefaultMaxJsonDepth);
      if (!list || !list->is_array() || list->empty()) return ToolParse{std::string(text), {}};
      for (const auto& c : *list) {
        ToolCall call;
        if (!call_from_json(c, &call)) return ToolParse{std::string(text), {}};
        r.calls.push_back(std::move(call));
      }
      used = end;
    } else {
      // NAME[ARGS]{...}, NAME[CALL_ID]ID[ARGS]{...}, or NAME{...} where the [ARGS] token was dropped.
      const size_t brace = t.find('{');
      if (brace == std::string_view::npos) return ToolParse{std::string(text), {}};
      std::string_view head = t.substr(0, brace);
      const size_t args_tag = head.find(kMistralArgs);
      if (args_tag != std::string_view::npos) {
        if (trim(head.substr(args_tag + kMistralArgs.size())) != "") return ToolParse{std::string(text), {}};
        head = head.substr(0, args_tag);
      }
      if (const size_t id_tag = head.find(kMistralCallId); id_tag != std::string_view::npos) head = head.substr(0, id_tag);
      ToolCall call;
      call.name = trim(head);
      if (call.name.empty() || call.name.find_first_of("[]{}\"") != std::string::npos) return ToolParse{std::string(text), {}};
      const size_t end = json_container_end(t.substr(brace));
      if (end == std::string_view::npos) return ToolParse{std::string(text), {}};
      const auto args = parse_ordered_json_bounded(t.substr(brace, end), kDefaultMaxJsonDepth);
      if (!args || !args->is_object()) return ToolParse{std::string(text), {}};
      call.arguments = args->dump();
      r.calls.push_back(std::move(call));
      used = brace + end;
    }
    const size_t after = size_t(t.data() - text.data()) + used;
    pos = text.find(kMistralCalls, after);
    add_content(&r.content, text.substr(after, pos == std::string_view::npos ? std::string_view::npos : pos - after));
  }
  return r;
}

ToolParse parse_gemma4(std::string_view text) {
  size_t pos = text.find(kGemmaCall);
  if (pos == std::string_view::npos) return ToolParse{std::string(text), {}};
  ToolParse r;
  add_content(&r.content, text.substr(0, pos));
  while (pos != std::string_view::npos) {
    size_t p = pos + kGemmaCall.size();
    while (p < text.size() && std::isspace(static_cast<unsigned char>(text[p]))) ++p;
    if (text.substr(p, kGemmaCallPrefix.size()) != kGemmaCallPrefix) return ToolParse{std::string(text), {}};
    p += kGemmaCallPrefix.size();
    const size_t brace = text.find('{', p);
    if (brace == std::string_view::npos) return ToolParse{std::string(text), {}};
    ToolCall call;
    call.name = trim(text.substr(p, brace - p));
    if (call.name.empty() || call.name.find_first_of("<>,:") != std::string::npos) return ToolParse{std::string(text), {}};
    size_t q = brace;
    ojson args;
    if (gemma4_value(text, &q, &args) != Scan::kDone || !args.is_object()) return ToolParse{std::string(text), {}};
    call.arguments = dump_json(args);
    r.calls.push_back(std::move(call));
    while (q < text.size() && std::isspace(static_cast<unsigned char>(text[q]))) ++q;
    if (text.substr(q, kGemmaCallEnd.size()) == kGemmaCallEnd) q += kGemmaCallEnd.size();
    pos = text.find(kGemmaCall, q);
    // The model opens the tool's response after its calls; that marker and a turn end are not content.
    std::string between(text.substr(q, pos == std::string_view::npos ? std::string_view::npos : pos - q));
    for (std::string_view tag : {kGemmaResponse, kGemmaTurnEnd}) {
      for (size_t t = between.find(tag); t != std::string::npos; t = between.find(tag)) between.erase(t, tag.size());
    }
    add_content(&r.content, between);
  }
  return r;
}

}  // namespace

bool parse_tool_call_format(const std::string& name, ToolCallFormat* out) {
  if (name == "hermes" || name == "qwen") *out = ToolCallFormat::kHermes;
  else if (name == "llama3" || name == "llama3_json") *out = ToolCallFormat::kLlama3;
  else if (name == "deepseek" || name == "deepseek_v3") *out = ToolCallFormat::kDeepSeek;
  else if (name == "qwen3_coder" || name == "qwen3_xml") *out = ToolCallFormat::kQwen3Coder;
  else if (name == "mistral") *out = ToolCallFormat::kMistral;
  else if (name == "gemma4") *out = ToolCallFormat::kGemma4;
  else if (name == "none") *out = ToolCallFormat::kNone;
  else return false;
  return true;
}

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3: return "llama3";
    case ToolCallFormat::kDeepSeek: return "deepseek";
    case ToolCallFormat::kQwen3Coder: return "qwen3_coder";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kGemma4: return "gemma4";
    default: return "none";
  }
}

bool tool_markers_are_special(ToolCallFormat f) {
  return f == ToolCallFormat::kDeepSeek || f == ToolCallFormat::kMistral || f == ToolCallFormat::kGemma4;
}

ToolCallFormat detect_tool_call_format(std::string_view tmpl) {
  // Qwen3-Coder's template writes <tool_call> too: the XML body decides first.
  if (tmpl.find(kXmlFunction) != std::string_view::npos && tmpl.find(kXmlParam) != std::string_view::npos) {
    return ToolCallFormat::kQwen3Coder;
  }
  if (tmpl.find(kGemmaCall) != std::string_view::npos) return ToolCallFormat::kGemma4;
  if (tmpl.find(kMistralCalls) != std::string_view::npos) return ToolCallFormat::kMistral;
  if (tmpl.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (tmpl.find(kDsCallsBegin) != std::string_view::npos || tmpl.find(kDsCallBegin) != std::string_view::npos) {
    return ToolCallFormat::kDeepSeek;
  }
  if (tmpl.find("<|eot_id|>") != std::string_view::npos && tmpl.find("\"parameters\"") != std::string_view::npos) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kNone;
}

ToolParse parse_tool_calls(ToolCallFormat format, std::string_view text, const ToolParamTypes* types) {
  switch (format) {
    case ToolCallFormat::kQwen3Coder: return parse_qwen3_xml(text, types);
    case ToolCallFormat::kMistral: return parse_mistral(text);
    case ToolCallFormat::kGemma4: return parse_gemma4(text);
    case ToolCallFormat::kHermes: return parse_hermes(text);
    case ToolCallFormat::kLlama3: return parse_llama3(text);
    case ToolCallFormat::kDeepSeek: return parse_deepseek(text);
    default: return ToolParse{std::string(text), {}};
  }
}

std::string ToolCallFilter::push(std::string_view text) {
  if (format_ == ToolCallFormat::kNone) return std::string(text);
  held_.append(text);
  if (capturing_) return "";
  if (format_ == ToolCallFormat::kLlama3) {
    if (passed_any_) return std::exchange(held_, std::string());
    size_t b = 0;
    while (b < held_.size() && std::isspace(static_cast<unsigned char>(held_[b]))) ++b;
    const std::string_view rest = std::string_view(held_).substr(b);
    if (rest.empty()) return "";
    if (rest[0] == '{' || rest.substr(0, kPythonTag.size()) == kPythonTag) {
      capturing_ = true;
      return "";
    }
    if (kPythonTag.substr(0, rest.size()) == rest) return "";
    passed_any_ = true;
    return std::exchange(held_, std::string());
  }
  const std::vector<std::string_view> markers = call_markers(format_);
  size_t pos = std::string::npos;
  for (std::string_view m : markers) pos = std::min(pos, held_.find(m));
  if (pos != std::string::npos) {
    capturing_ = true;
    std::string out = held_.substr(0, pos);
    held_.erase(0, pos);
    return out;
  }
  size_t keep = 0;
  for (std::string_view m : markers) keep = std::max(keep, partial_suffix_length(held_, m));
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

ToolParse ToolCallFilter::finish() {
  std::string rest = std::exchange(held_, std::string());
  if (!capturing_) return ToolParse{std::move(rest), {}};
  return parse_tool_calls(format_, rest, types_.get());
}

}  // namespace strata::server
