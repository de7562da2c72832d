#include "tokenizer/jinja/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "tokenizer/jinja/failure.h"
#include "tokenizer/jinja/text.h"

namespace strata::tokenizer::jinja {

namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

// jinja2 reads the source with universal newlines and, without keep_trailing_newline,
// drops one final newline.
std::string normalize_source(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The escapes of a Python string literal (jinja2 decodes literals with "unicode-escape").
std::string unescape(const std::string& raw, int line) {
  std::string out;
  for (size_t i = 0; i < raw.size(); ++i) {
    char c = raw[i];
    if (c != '\\' || i + 1 == raw.size()) {
      out += c;
      continue;
    }
    char e = raw[++i];
    switch (e) {
      case '\n': break;
      case '\\': out += '\\'; break;
      case '\'': out += '\''; break;
      case '"': out += '"'; break;
      case 'a': out += '\a'; break;
      case 'b': out += '\b'; break;
      case 'f': out += '\f'; break;
      case 'n': out += '\n'; break;
      case 'r': out += '\r'; break;
      case 't': out += '\t'; break;
      case 'v': out += '\v'; break;
      case 'x': case 'u': case 'U': {
        size_t n = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
        uint32_t cp = 0;
        for (size_t k = 0; k < n; ++k) {
          int d = i + 1 + k < raw.size() ? hex_digit(raw[i + 1 + k]) : -1;
          if (d < 0) fail(std::string("truncated \\") + e + " escape in string literal", line);
          cp = cp * 16 + static_cast<uint32_t>(d);
        }
        i += n;
        if (cp > 0x10FFFF) fail("illegal Unicode character in string literal", line);
        append_utf8(out, cp);
        break;
      }
      default:
        if (e >= '0' && e <= '7') {
          uint32_t cp = static_cast<uint32_t>(e - '0');
          for (int k = 0; k < 2 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7'; ++k) {
            cp = cp * 8 + static_cast<uint32_t>(raw[++i] - '0');
          }
          append_utf8(out, cp);
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string source) : src_(std::move(source)) {}

  std::vector<Token> run() {
    bool line_starting = true;
    while (pos_ < src_.size()) {
      size_t start = find_tag_start(pos_);
      if (start == std::string::npos) {
        emit_data(src_.substr(pos_));
        advance_to(src_.size());
        break;
      }
      char type = src_[start + 1];  // '{', '%' or '#'
      size_t after = start + 2;
      char sign = (after < src_.size() && (src_[after] == '-' || src_[after] == '+')) ? src_[after] : 0;
      std::string text = src_.substr(pos_, start - pos_);
      text = control_before(text, sign, type != '{', line_starting);
      emit_data(text);
      advance_to(start);
      size_t body = after + (sign ? 1 : 0);
      if (type == '#') {
        line_starting = lex_comment(body);
      } else if (type == '%' && is_raw_begin(body)) {
        line_starting = lex_raw();
      } else {
        line_starting = lex_tag(type == '{', body);
      }
    }
    Token eof;
    eof.kind = TokenKind::kEof;
    eof.line = line_;
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  size_t find_tag_start(size_t from) const {
    for (size_t i = from; i + 1 < src_.size(); ++i) {
      if (src_[i] == '{' && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    }
    return std::string::npos;
  }

  // Whitespace control on the text before a tag: `-` strips all of it, otherwise
  // lstrip_blocks drops spaces and tabs between a line start and a block or comment tag.
  static std::string control_before(const std::string& text, char sign, bool is_block, bool line_starting) {
    if (sign == '-') {
      size_t end = text.size();
      while (end > 0 && is_space(text[end - 1])) --end;
      return text.substr(0, end);
    }
    if (sign == '+' || !is_block) return text;
    size_t nl = text.rfind('\n');
    size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
    if (l_pos == 0 && !line_starting) return text;
    for (size_t i = l_pos; i < text.size(); ++i) {
      if (text[i] != ' ' && text[i] != '\t') return text;
    }
    return text.substr(0, l_pos);
  }

  void emit_data(const std::string& text) {
    if (text.empty()) return;
    Token t;
    t.kind = TokenKind::kData;
    t.text = text;
    t.line = line_;
    tokens_.push_back(std::move(t));
  }

  void emit(TokenKind kind, std::string text, int line) {
    Token t;
    t.kind = kind;
    t.text = std::move(text);
    t.line = line;
    tokens_.push_back(std::move(t));
  }

  void advance_to(size_t to) {
    for (size_t i = pos_; i < to && i < src_.size(); ++i) {
      if (src_[i] == '\n') ++line_;
    }
    pos_ = to;
  }

  // After a tag end: `-` eats all whitespace, `+` nothing, and a plain block or comment end
  // eats one newline (trim_blocks). Returns whether the consumed text ended a line.
  bool control_after(size_t end, char sign, bool trim_newline) {
    size_t p = end;
    if (sign == '-') {
      while (p < src_.size() && is_space(src_[p])) ++p;
    } else if (sign != '+' && trim_newline && p < src_.size() && src_[p] == '\n') {
      ++p;
    }
    bool ended_line = p > 0 && src_[p - 1] == '\n';
    advance_to(p);
    return ended_line;
  }

  bool lex_comment(size_t body) {
    size_t end = src_.find("#}", body);
    if (end == std::string::npos) fail("missing end of comment tag", line_);
    char sign = (end > body && (src_[end - 1] == '-' || src_[end - 1] == '+')) ? src_[end - 1] : 0;
    advance_to(end);
    return control_after(end + 2, sign, true);
  }

  // Matches `raw` followed by the end of the tag; leaves raw_end_ just past `%}`.
  bool is_raw_begin(size_t body) {
    size_t p = body;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    if (p < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) return false;
    while (p < src_.size() && is_space(src_[p])) ++p;
    raw_sign_ = 0;
    if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) raw_sign_ = src_[p++];
    if (src_.compare(p, 2, "%}") != 0) return false;
    raw_end_ = p + 2;
    return true;
  }

  bool lex_raw() {
    // The raw opening tag never trims the newline after it (jinja2's raw_begin rule).
    bool line_starting = control_after(raw_end_, raw_sign_ == '-' ? '-' : '+', false);
    size_t search = pos_;
    while (true) {
      size_t start = src_.find("{%", search);
      if (start == std::string::npos) fail("missing end of raw directive", line_);
      size_t p = start + 2;
      char sign = (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) ? src_[p] : 0;
      if (sign) ++p;
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        search = start + 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && is_space(src_[p])) ++p;
      char end_sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) end_sign = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) {
        search = start + 2;
        continue;
      }
      std::string text = control_before(src_.substr(pos_, start - pos_), sign, true, line_starting);
      emit_data(text);
      advance_to(p);
      return control_after(p + 2, end_sign, true);
    }
  }

  bool lex_tag(bool is_var, size_t body) {
    emit(is_var ? TokenKind::kVarBegin : TokenKind::kBlockBegin, is_var ? "{{" : "{%", line_);
    advance_to(body);
    int balance = 0;
    const char* close = is_var ? "}}" : "%}";
    while (true) {
      while (pos_ < src_.size() && is_space(src_[pos_])) advance_to(pos_ + 1);
      if (pos_ >= src_.size()) fail(is_var ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'", line_);
      if (balance == 0) {
        char sign = 0;
        size_t p = pos_;
        if ((src_[p] == '-' || (!is_var && src_[p] == '+')) && src_.compare(p + 1, 2, close) == 0) sign = src_[p++];
        if (src_.compare(p, 2, close) == 0) {
          emit(is_var ? TokenKind::kVarEnd : TokenKind::kBlockEnd, close, line_);
          advance_to(p);
          return control_after(p + 2, sign, !is_var);
        }
      }
      lex_expression_token(balance);
    }
  }

  void lex_expression_token(int& balance) {
    char c = src_[pos_];
    int line = line_;
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t p = pos_;
      while (p < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[p])) || src_[p] == '_')) ++p;
      emit(TokenKind::kName, src_.substr(pos_, p - pos_), line);
      advance_to(p);
      return;
    }
    if (c == '\'' || c == '"') {
      size_t p = pos_ + 1;
      std::string raw;
      while (p < src_.size() && src_[p] != c) {
        if (src_[p] == '\\' && p + 1 < src_.size()) raw += src_[p++];
        raw += src_[p++];
      }
      if (p >= src_.size()) fail("unexpected end of string literal", line);
      Token t;
      t.kind = TokenKind::kString;
      t.text = unescape(raw, line);
      t.line = line;
      tokens_.push_back(std::move(t));
      advance_to(p + 1);
      return;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) {
      lex_number();
      return;
    }
    static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~", "[", "]",
                                 "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};
    for (const char* op : kOps) {
      size_t n = std::strlen(op);
      if (src_.compare(pos_, n, op) == 0) {
        if (op[0] == '(' || op[0] == '[' || op[0] == '{') ++balance;
        if ((op[0] == ')' || op[0] == ']' || op[0] == '}') && n == 1) {
          if (balance == 0) fail(std::string("unexpected '") + op + "'", line);
          --balance;
        }
        emit(TokenKind::kOperator, op, line);
        advance_to(pos_ + n);
        return;
      }
    }
    fail(std::string("unexpected char '") + c + "'", line);
  }

  static bool digits_run(const std::string& s, size_t& p) {
    // (\d+_)*\d+
    size_t start = p;
    while (p < s.size() && (std::isdigit(static_cast<unsigned char>(s[p])) ||
                            (s[p] == '_' && p > start && p + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[p + 1]))))) {
      ++p;
    }
    return p > start;
  }

  void lex_number() {
    int line = line_;
    size_t p = pos_;
    bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
    digits_run(src_, p);
    bool is_float = false;
    if (!after_dot) {
      size_t q = p;
      if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
        ++q;
        digits_run(src_, q);
        p = q;
        is_float = true;
      }
      if (p < src_.size() && (src_[p] == 'e' || src_[p] == 'E')) {
        size_t r = p + 1;
        if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
        if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
          digits_run(src_, r);
          p = r;
          is_float = true;
        }
      }
    }
    std::string text;
    for (size_t i = pos_; i < p; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    Token t;
    t.line = line;
    t.text = text;
    if (is_float) {
      t.kind = TokenKind::kFloat;
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      t.kind = TokenKind::kInteger;
      errno = 0;
      t.int_value = std::strtoll(text.c_str(), nullptr, 10);
      if (errno == ERANGE) fail("integer literal " + text + " is too large", line);
    }
    tokens_.push_back(std::move(t));
    advance_to(p);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
  size_t raw_end_ = 0;
  char raw_sign_ = 0;
};

}  // namespace

std::vector<Token> tokenize(const std::string& source) { return Lexer(normalize_source(source)).run(); }

}  // namespace strata::tokenizer::jinja
