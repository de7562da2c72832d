#include "server/tool_parser.h"

#include <cctype>
#include <utility>

#include <nlohmann/json.hpp>

#include "server/json_guard.h"
#include "server/stop_matcher.h"

namespace strata::server {

namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";

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

// End (exclusive) of the JSON object starting at text[0] == '{'; npos when it never closes.
size_t json_object_end(std::string_view text) {
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
    else if (c == '{') ++depth;
    else if (c == '}' && --depth == 0) return i + 1;
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
    const size_t end = json_object_end(t);
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

}  // namespace

bool parse_tool_call_format(const std::string& name, ToolCallFormat* out) {
  if (name == "hermes" || name == "qwen") *out = ToolCallFormat::kHermes;
  else if (name == "llama3" || name == "llama3_json") *out = ToolCallFormat::kLlama3;
  else if (name == "deepseek" || name == "deepseek_v3") *out = ToolCallFormat::kDeepSeek;
  else if (name == "none") *out = ToolCallFormat::kNone;
  else return false;
  return true;
}

const char* tool_call_format_name(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3: return "llama3";
    case ToolCallFormat::kDeepSeek: return "deepseek";
    default: return "none";
  }
}

ToolCallFormat detect_tool_call_format(std::string_view tmpl) {
  if (tmpl.find(kHermesOpen) != std::string_view::npos) return ToolCallFormat::kHermes;
  if (tmpl.find(kDsCallsBegin) != std::string_view::npos || tmpl.find(kDsCallBegin) != std::string_view::npos) {
    return ToolCallFormat::kDeepSeek;
  }
  if (tmpl.find("<|eot_id|>") != std::string_view::npos && tmpl.find("\"parameters\"") != std::string_view::npos) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kNone;
}

ToolParse parse_tool_calls(ToolCallFormat format, std::string_view text) {
  switch (format) {
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
  const std::string_view marker = format_ == ToolCallFormat::kHermes ? kHermesOpen : kDsCallsBegin;
  size_t pos = held_.find(marker);
  if (format_ == ToolCallFormat::kDeepSeek) pos = std::min(pos, held_.find(kDsCallBegin));
  if (pos != std::string::npos) {
    capturing_ = true;
    std::string out = held_.substr(0, pos);
    held_.erase(0, pos);
    return out;
  }
  size_t keep = partial_suffix_length(held_, marker);
  if (format_ == ToolCallFormat::kDeepSeek) keep = std::max(keep, partial_suffix_length(held_, kDsCallBegin));
  std::string out = held_.substr(0, held_.size() - keep);
  held_.erase(0, held_.size() - keep);
  return out;
}

ToolParse ToolCallFilter::finish() {
  std::string rest = std::exchange(held_, std::string());
  if (!capturing_) return ToolParse{std::move(rest), {}};
  return parse_tool_calls(format_, rest);
}

}  // namespace strata::server
