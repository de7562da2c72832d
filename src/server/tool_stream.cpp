#include "server/tool_stream.h"

#include <cctype>

#include <nlohmann/json.hpp>

namespace strata::server {

namespace {

constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";

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

}  // namespace

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
    }
    // kArguments: pass the object through, whitespace outside strings dropped.
    std::string piece;
    bool closed = false;
    size_t i = cursor_;
    for (; i < t.size() && !closed; ++i) {
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
    cursor_ = i;
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
