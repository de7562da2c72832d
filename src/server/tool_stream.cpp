#include "server/tool_stream.h"

#include <cctype>

#include <nlohmann/json.hpp>

#include "server/stop_matcher.h"
#include "server/tool_formats.h"

namespace strata::server {

namespace {


// A step of header reading: matched, cannot match, or the text ends before it can tell.
enum class Match { kYes, kNo, kMore };

bool is_space(char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; }

size_t skip_space(std::string_view t, size_t p) {
  while (p < t.size() && is_space(t[p])) ++p;
  return p;
}

Match literal(std::string_view t, size_t* p, std::string_view lit) {
  const std::string_view rest = t.substr(*p);
  if (rest.size() < lit.size()) return lit.substr(0, rest.size()) == rest ? Match::kMore : Match::kNo;
  if (rest.substr(0, lit.size()) != lit) return Match::kNo;
  *p += lit.size();
  return Match::kYes;
}

// A JSON string literal at t[*p] == '"'; *out is its decoded value.
Match json_string(std::string_view t, size_t* p, std::string* out) {
  if (*p >= t.size()) return Match::kMore;
  if (t[*p] != '"') return Match::kNo;
  bool escaped = false;
  for (size_t i = *p + 1; i < t.size(); ++i) {
    if (escaped) {
      escaped = false;
    } else if (t[i] == '\\') {
      escaped = true;
    } else if (t[i] == '"') {
      const auto v = nlohmann::json::parse(t.substr(*p, i + 1 - *p), nullptr, /*allow_exceptions=*/false);
      if (!v.is_string()) return Match::kNo;
      *out = v.get<std::string>();
      *p = i + 1;
      return Match::kYes;
    }
  }
  return Match::kMore;
}

// `{"name": "NAME", "arguments"|"parameters": {` from t[*p]; *p ends at the arguments' '{'.
Match object_header(std::string_view t, size_t* p, std::string* name) {
  size_t q = skip_space(t, *p);
  std::string key;
  Match m;
  if ((m = literal(t, &q, "{")) != Match::kYes) return m;
  q = skip_space(t, q);
  if ((m = json_string(t, &q, &key)) != Match::kYes) return m;
  if (key != "name") return Match::kNo;  // arguments first: only the whole parse reads it
  q = skip_space(t, q);
  if ((m = literal(t, &q, ":")) != Match::kYes) return m;
  q = skip_space(t, q);
  if ((m = json_string(t, &q, name)) != Match::kYes) return m;
  if (name->empty()) return Match::kNo;
  q = skip_space(t, q);
  if ((m = literal(t, &q, ",")) != Match::kYes) return m;
  q = skip_space(t, q);
  if ((m = json_string(t, &q, &key)) != Match::kYes) return m;
  if (key != "arguments" && key != "parameters") return Match::kNo;
  q = skip_space(t, q);
  if ((m = literal(t, &q, ":")) != Match::kYes) return m;
  q = skip_space(t, q);
  if (q >= t.size()) return Match::kMore;
  if (t[q] != '{') return Match::kNo;  // a string or null: the whole parse handles it
  *p = q;
  return Match::kYes;
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::string(s.substr(b, e - b));
}

// DeepSeek: <｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{ (V3) or
// <｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{ (V3.1), from the first call begin at or after *p.
Match deepseek_header(std::string_view t, size_t* p, std::string* name) {
  const size_t begin = t.find(kDsCallBegin, *p);
  if (begin == std::string_view::npos) return Match::kMore;
  const size_t body = begin + kDsCallBegin.size();
  const size_t sep = t.find(kDsSep, body);
  if (sep == std::string_view::npos) return Match::kMore;
  const std::string left = trim(t.substr(body, sep - body));
  size_t q = sep + kDsSep.size();
  if (left == "function") {
    const size_t fence = t.find("```", q);
    if (fence == std::string_view::npos) return Match::kMore;
    *name = trim(t.substr(q, fence - q));
    q = fence + 3;
    if (const Match m = literal(t, &q, "json"); m == Match::kMore) return m;
  } else {
    *name = left;
  }
  if (name->empty()) return Match::kNo;
  q = skip_space(t, q);
  if (q >= t.size()) return Match::kMore;
  if (t[q] != '{') return Match::kNo;
  *p = q;
  return Match::kYes;
}

// The rest of a JSON object from t[*p] to its closing '}' (strings skipped); *p ends after it.
Match close_object(std::string_view t, size_t* p) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = *p; i < t.size(); ++i) {
    const char c = t[i];
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (depth-- == 0) {
        if (c != '}') return Match::kNo;
        *p = i + 1;
        return Match::kYes;
      }
    }
  }
  return Match::kMore;
}

// Mistral: [TOOL_CALLS]NAME[ARGS]{ (or NAME[CALL_ID]ID[ARGS]{, or NAME{) from the next marker at
// or after *p, or [TOOL_CALLS][{"name": ..., "arguments": { opening a JSON list (*list set).
// `in_list`: the previous call's arguments closed inside such a list; the next one follows a ','.
Match mistral_header(std::string_view t, size_t* p, bool in_list, bool* list, std::string* name) {
  size_t q = *p;
  Match m;
  if (in_list) {
    if ((m = close_object(t, &q)) != Match::kYes) return m;
    q = skip_space(t, q);
    if (q >= t.size()) return Match::kMore;
    if (t[q] != ',') return Match::kNo;  // ']': the list ends, and the stream with it
    ++q;
    if ((m = object_header(t, &q, name)) != Match::kYes) return m;
    *p = q;
    return Match::kYes;
  }
  const size_t at = t.find(kMistralCalls, q);
  if (at == std::string_view::npos) return Match::kMore;
  q = skip_space(t, at + kMistralCalls.size());
  if (q >= t.size()) return Match::kMore;
  if (t[q] == '[') {
    *list = true;
    ++q;
    if ((m = object_header(t, &q, name)) != Match::kYes) return m;
    *p = q;
    return Match::kYes;
  }
  const size_t brace = t.find('{', q);
  if (brace == std::string_view::npos) return Match::kMore;
  std::string_view head = t.substr(q, brace - q);
  if (const size_t a = head.find(kMistralArgs); a != std::string_view::npos) head = head.substr(0, a);
  if (const size_t c = head.find(kMistralCallId); c != std::string_view::npos) head = head.substr(0, c);
  *name = trim(head);
  if (name->empty() || name->find_first_of("[]{}\"") != std::string::npos) return Match::kNo;
  *p = brace;
  return Match::kYes;
}

// Gemma 4: <|tool_call>call:NAME{ from the next call marker at or after *p; *p ends past the '{'.
Match gemma4_header(std::string_view t, size_t* p, std::string* name) {
  const size_t at = t.find(kGemmaCall, *p);
  if (at == std::string_view::npos) return Match::kMore;
  size_t q = skip_space(t, at + kGemmaCall.size());
  Match m;
  if ((m = literal(t, &q, "call:")) != Match::kYes) return m;
  const size_t brace = t.find('{', q);
  if (brace == std::string_view::npos) return t.find_first_of("<>,:", q) == std::string_view::npos ? Match::kMore : Match::kNo;
  *name = trim(t.substr(q, brace - q));
  if (name->empty() || name->find_first_of("<>,:") != std::string::npos) return Match::kNo;
  *p = brace + 1;
  return Match::kYes;
}

// Qwen3-Coder: <function=NAME> from the next one at or after *p; *p ends past the '>'.
Match xml_header(std::string_view t, size_t* p, std::string* name) {
  const size_t at = t.find(kXmlFunction, *p);
  if (at == std::string_view::npos) return Match::kMore;
  const size_t gt = t.find('>', at);
  if (gt == std::string_view::npos) return Match::kMore;
  *name = trim(t.substr(at + kXmlFunction.size(), gt - at - kXmlFunction.size()));
  if (name->empty() || name->find('<') != std::string::npos) return Match::kNo;
  *p = gt + 1;
  return Match::kYes;
}

}  // namespace

std::string ToolCallStreamer::read_pairs(std::string_view t, bool* closed) {
  using ojson = nlohmann::ordered_json;
  std::string piece;
  auto add = [&](const std::string& key, const ojson& v) {
    if (n_pairs_++ > 0) piece += ',';
    piece += dump_json(ojson(key)) + ":" + dump_json(v);
  };
  // JSON string escapes of text, without the quotes.
  auto escaped = [](std::string_view text) {
    const std::string q = dump_json(ojson(std::string(text)));
    return q.substr(1, q.size() - 2);
  };
  for (;;) {
    if (format_ == ToolCallFormat::kGemma4) {
      size_t q = skip_space(t, cursor_);
      if (q >= t.size()) break;
      if (t[q] == '}') {
        cursor_ = q + 1;
        *closed = true;
        return piece + "}";
      }
      if (n_pairs_ > 0) {
        if (t[q] != ',') {
          state_ = State::kWhole;
          break;
        }
        ++q;
      }
      std::string key;
      ojson v;
      Scan s = gemma4_key(t, &q, &key);
      if (s == Scan::kDone) s = gemma4_value(t, &q, &v);
      if (s == Scan::kBad) state_ = State::kWhole;
      if (s != Scan::kDone) break;
      add(key, v);
      cursor_ = q;
      continue;
    }
    // kQwen3Coder: <parameter=K>\nVALUE\n</parameter> ... </function>
    if (value_open_) {
      const size_t vend = std::min({t.find(kXmlParamEnd, cursor_), t.find(kXmlParam, cursor_), t.find(kXmlFunctionEnd, cursor_)});
      if (vend == std::string_view::npos) {
        // The newline after the tag is not part of the value, nor a tail that may begin the
        // value's end (the newline before </parameter>) or cut a character.
        if (value_sent_ == cursor_) {
          if (t.size() == cursor_) break;
          if (t[cursor_] == '\n') ++value_sent_;
        }
        const std::string_view rest = t.substr(value_sent_);
        size_t keep = 0;
        for (std::string_view m : {std::string_view("\n</parameter>"), std::string_view("\n<parameter="),
                                   std::string_view("\n</function>"), kXmlParamEnd, kXmlParam, kXmlFunctionEnd}) {
          keep = std::max(keep, partial_suffix_length(rest, m));
        }
        size_t safe = rest.size() - keep;
        for (size_t back = 1; back <= 3 && back <= safe; ++back) {
          const unsigned char c = static_cast<unsigned char>(rest[safe - back]);
          if ((c & 0xC0) != 0x80) {  // the lead byte of the last character
            const size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
            if (len > back) safe -= back;
            break;
          }
        }
        piece += escaped(rest.substr(0, safe));
        value_sent_ += safe;
        break;
      }
      const std::string_view value = xml_param_text(t.substr(cursor_, vend - cursor_));
      const size_t sent = value_sent_ - cursor_ - (t[cursor_] == '\n' && value_sent_ > cursor_ ? 1 : 0);
      piece += escaped(value.substr(std::min(sent, value.size()))) + "\"";
      value_open_ = false;
      cursor_ = t.substr(vend, kXmlParamEnd.size()) == kXmlParamEnd ? vend + kXmlParamEnd.size() : vend;
      continue;
    }
    const size_t param = t.find(kXmlParam, cursor_);
    const size_t end = t.find(kXmlFunctionEnd, cursor_);
    if (end != std::string_view::npos && (param == std::string_view::npos || end < param)) {
      cursor_ = end + kXmlFunctionEnd.size();
      *closed = true;
      return piece + "}";
    }
    if (param == std::string_view::npos) break;
    const size_t gt = t.find('>', param);
    if (gt == std::string_view::npos) break;
    const std::string key = trim(t.substr(param + kXmlParam.size(), gt - param - kXmlParam.size()));
    if (key.empty()) {
      state_ = State::kWhole;
      break;
    }
    const std::string type = declared_param_type(types_.get(), name_, key);
    if (xml_type_is_text(type)) {
      if (n_pairs_++ > 0) piece += ',';
      piece += dump_json(ojson(key)) + ":\"";
      value_open_ = true;
      cursor_ = value_sent_ = gt + 1;
      continue;
    }
    // The value ends at its </parameter>, or (left open) at the next parameter or the call's end.
    size_t vend = std::min({t.find(kXmlParamEnd, gt), t.find(kXmlParam, gt), t.find(kXmlFunctionEnd, gt)});
    if (vend == std::string_view::npos) break;
    add(key, xml_param_value(xml_param_text(t.substr(gt + 1, vend - gt - 1)), type));
    cursor_ = t.substr(vend, kXmlParamEnd.size()) == kXmlParamEnd ? vend + kXmlParamEnd.size() : vend;
  }
  return piece;
}

bool ToolCallStreamer::read_header(std::string_view t) {
  size_t p = cursor_;
  Match m = Match::kNo;
  switch (format_) {
    case ToolCallFormat::kHermes: {
      const size_t open = t.find(kHermesOpen, p);
      if (open == std::string_view::npos) return false;
      p = open + kHermesOpen.size();
      m = object_header(t, &p, &name_);
      break;
    }
    case ToolCallFormat::kLlama3: {
      p = skip_space(t, p);
      if (state_ == State::kAfterCall) {
        // The call object closes, then ';' and the next call.
        if ((m = literal(t, &p, "}")) == Match::kYes) {
          p = skip_space(t, p);
          m = literal(t, &p, ";");
        }
      } else {
        m = literal(t, &p, kPythonTag);
        if (m == Match::kNo) m = Match::kYes;  // the tag is optional
      }
      if (m == Match::kYes) m = object_header(t, &p, &name_);
      break;
    }
    case ToolCallFormat::kDeepSeek: m = deepseek_header(t, &p, &name_); break;
    case ToolCallFormat::kQwen3Coder: m = xml_header(t, &p, &name_); break;
    case ToolCallFormat::kGemma4: m = gemma4_header(t, &p, &name_); break;
    case ToolCallFormat::kMistral:
      m = mistral_header(t, &p, list_ && state_ == State::kAfterCall, &list_, &name_);
      break;
    default: break;
  }
  if (m == Match::kNo) state_ = State::kWhole;
  if (m != Match::kYes) return false;
  cursor_ = p;
  return true;
}

std::vector<ToolCallDelta> ToolCallStreamer::update(std::string_view t) {
  std::vector<ToolCallDelta> out;
  for (;;) {
    if (state_ == State::kWhole) break;
    if (state_ == State::kHeader || state_ == State::kAfterCall) {
      if (!read_header(t)) break;
      ToolCallDelta d;
      d.index = int(streamed_.size());
      d.first = true;
      d.name = name_;
      out.push_back(std::move(d));
      streamed_.emplace_back();
      names_.push_back(name_);
      state_ = State::kArguments;
      depth_ = 0;
      in_string_ = escaped_ = false;
      n_pairs_ = 0;
      if (format_ == ToolCallFormat::kQwen3Coder || format_ == ToolCallFormat::kGemma4) {
        out.back().arguments = "{";
        streamed_.back() = "{";
      }
    }
    std::string piece;
    bool closed = false;
    if (format_ == ToolCallFormat::kQwen3Coder || format_ == ToolCallFormat::kGemma4) {
      piece = read_pairs(t, &closed);
    }
    // kArguments of the JSON formats: pass the object through, whitespace outside strings dropped.
    size_t i = cursor_;
    const bool json_args = format_ != ToolCallFormat::kQwen3Coder && format_ != ToolCallFormat::kGemma4;
    for (; json_args && i < t.size() && !closed; ++i) {
      const char c = t[i];
      if (in_string_) {
        piece += c;
        if (escaped_) escaped_ = false;
        else if (c == '\\') escaped_ = true;
        else if (c == '"') in_string_ = false;
        continue;
      }
      if (is_space(c)) continue;
      piece += c;
      if (c == '"') in_string_ = true;
      else if (c == '{' || c == '[') ++depth_;
      else if ((c == '}' || c == ']') && --depth_ == 0) closed = true;
    }
    if (json_args) cursor_ = i;
    if (!piece.empty()) {
      streamed_.back() += piece;
      if (!out.empty() && out.back().index == int(streamed_.size()) - 1) {
        out.back().arguments += piece;
      } else {
        ToolCallDelta d;
        d.index = int(streamed_.size()) - 1;
        d.arguments = std::move(piece);
        out.push_back(std::move(d));
      }
    }
    if (!closed) break;
    state_ = State::kAfterCall;
  }
  return out;
}

std::vector<ToolCallDelta> ToolCallStreamer::finish(const std::vector<ToolCall>& calls) {
  std::vector<ToolCallDelta> out;
  for (size_t i = 0; i < calls.size(); ++i) {
    ToolCallDelta d;
    d.index = int(i);
    if (i < streamed_.size()) {
      // Shown already: only what the stream has not written yet. Where the final text differs
      // from the streamed one (a number or escape spelled otherwise), the streamed JSON is
      // equivalent and stands.
      const std::string& sent = streamed_[i];
      if (names_[i] != calls[i].name || calls[i].arguments.compare(0, sent.size(), sent) != 0) continue;
      d.arguments = calls[i].arguments.substr(sent.size());
      if (d.arguments.empty()) continue;
    } else {
      d.first = true;
      d.name = calls[i].name;
      d.arguments = calls[i].arguments;
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace strata::server
