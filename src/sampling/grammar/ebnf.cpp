// GBNF (llama.cpp's grammar syntax) to the grammar IR.
#include "sampling/grammar/ebnf.h"

#include <algorithm>
#include <map>

namespace strata::grammar {

namespace {

struct EbnfError {
  std::string message;
};

class EbnfParser {
 public:
  EbnfParser(GrammarBuilder& b, std::string_view text) : b_(b), s_(text) {}

  RuleId parse() {
    skip_space();
    while (i_ < s_.size()) {
      const std::string name = parse_name();
      skip_space();
      if (s_.substr(i_, 3) != "::=") fail("expected '::=' after rule name '" + name + "'");
      i_ += 3;
      const RuleId r = rule(name);
      if (defined_.count(name)) fail("rule '" + name + "' is defined twice");
      defined_[name] = true;
      b_.set_rule(r, parse_alternatives(0));
      skip_space();
      if (i_ < s_.size() && s_[i_] == ')') fail("unexpected ')'");
    }
    for (auto& [name, r] : rules_)
      if (!defined_.count(name)) throw EbnfError{"ebnf: rule '" + name + "' is used but not defined"};
    if (!rules_.count("root")) throw EbnfError{"ebnf: no 'root' rule"};
    return rules_["root"];
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    size_t line = 1 + std::count(s_.begin(), s_.begin() + std::min(i_, s_.size()), '\n');
    throw EbnfError{"ebnf: " + what + " at line " + std::to_string(line)};
  }
  void skip_space() {
    while (i_ < s_.size()) {
      if (s_[i_] == '#') {
        while (i_ < s_.size() && s_[i_] != '\n') ++i_;
      } else if (isspace(static_cast<unsigned char>(s_[i_]))) {
        ++i_;
      } else {
        break;
      }
    }
  }
  static bool name_char(char c) { return isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; }
  std::string parse_name() {
    const size_t start = i_;
    while (i_ < s_.size() && name_char(s_[i_])) ++i_;
    if (i_ == start) fail(std::string("expected a rule name, got '") + (i_ < s_.size() ? s_[i_] : ' ') + "'");
    return std::string(s_.substr(start, i_ - start));
  }
  RuleId rule(const std::string& name) {
    auto it = rules_.find(name);
    if (it != rules_.end()) return it->second;
    const RuleId r = b_.add_rule(name);
    rules_[name] = r;
    return r;
  }
  // Is the text at i_ the start of the next rule ("name ::=")?
  bool at_rule_start() {
    size_t j = i_;
    while (j < s_.size() && name_char(s_[j])) ++j;
    if (j == i_) return false;
    while (j < s_.size() && (s_[j] == ' ' || s_[j] == '\t' || s_[j] == '\n' || s_[j] == '\r')) ++j;
    return s_.substr(j, 3) == "::=";
  }

  ExprId parse_alternatives(int depth) {
    if (depth > 200) fail("groups nested too deeply");
    std::vector<ExprId> alts{parse_sequence(depth)};
    skip_space();
    while (i_ < s_.size() && s_[i_] == '|') {
      ++i_;
      alts.push_back(parse_sequence(depth));
      skip_space();
    }
    return b_.alt(std::move(alts));
  }

  ExprId parse_sequence(int depth) {
    std::vector<ExprId> items;
    for (;;) {
      skip_space();
      if (i_ >= s_.size() || s_[i_] == '|' || s_[i_] == ')') break;
      if (at_rule_start()) break;
      ExprId atom = parse_atom(depth);
      items.push_back(parse_quantifier(atom));
    }
    return b_.seq(std::move(items));
  }

  bool parse_int(int& v) {
    size_t j = i_;
    long long x = 0;
    while (j < s_.size() && isdigit(static_cast<unsigned char>(s_[j])) && x < 1000000) x = x * 10 + (s_[j++] - '0');
    if (j == i_) return false;
    v = static_cast<int>(x);
    i_ = j;
    return true;
  }

  ExprId parse_quantifier(ExprId atom) {
    if (i_ >= s_.size()) return atom;
    const char c = s_[i_];
    if (c == '*') return ++i_, b_.star(atom);
    if (c == '+') return ++i_, b_.plus(atom);
    if (c == '?') return ++i_, b_.opt(atom);
    if (c != '{') return atom;
    ++i_;
    skip_space();
    int lo = 0, hi;
    if (!parse_int(lo)) fail("bad {m,n} repetition");
    skip_space();
    hi = lo;
    if (i_ < s_.size() && s_[i_] == ',') {
      ++i_;
      skip_space();
      hi = -1;
      if (i_ < s_.size() && s_[i_] != '}' && !parse_int(hi)) fail("bad {m,n} repetition");
      skip_space();
    }
    if (i_ >= s_.size() || s_[i_] != '}') fail("bad {m,n} repetition");
    ++i_;
    if (hi >= 0 && hi < lo) fail("repetition {" + std::to_string(lo) + "," + std::to_string(hi) + "} has max < min");
    return b_.repeat(atom, lo, hi);
  }

  uint32_t parse_hex(int n) {
    uint32_t v = 0;
    for (int k = 0; k < n; ++k) {
      if (i_ >= s_.size() || !isxdigit(static_cast<unsigned char>(s_[i_]))) fail("bad hex escape");
      const char h = s_[i_++];
      v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return v;
  }
  // One code point of a literal or class, escapes decoded.
  uint32_t parse_char() {
    if (i_ >= s_.size()) fail("unterminated literal or class");
    if (s_[i_] == '\\') {
      ++i_;
      if (i_ >= s_.size()) fail("trailing backslash");
      const char c = s_[i_++];
      switch (c) {
        case 'n': return '\n';
        case 'r': return '\r';
        case 't': return '\t';
        case 'x': return parse_hex(2);
        case 'u': return parse_hex(4);
        case 'U': return parse_hex(8);
        case '\\': case '"': case '\'': case '[': case ']': case '-': case '^': return static_cast<uint8_t>(c);
        default: fail(std::string("unknown escape '\\") + c + "'");
      }
    }
    const auto c = static_cast<uint8_t>(s_[i_]);
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + n > s_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(s_[i_ + k]) & 0x3F);
    i_ += n;
    return cp;
  }

  ExprId parse_atom(int depth) {
    const char c = s_[i_];
    if (c == '"') {
      ++i_;
      std::vector<ExprId> items;
      while (i_ < s_.size() && s_[i_] != '"') {
        const uint32_t cp = parse_char();
        items.push_back(b_.code_point_range(cp, cp));
      }
      if (i_ >= s_.size()) fail("unterminated string literal");
      ++i_;
      return b_.seq(std::move(items));
    }
    if (c == '[') {
      ++i_;
      bool negate = false;
      if (i_ < s_.size() && s_[i_] == '^') {
        ++i_;
        negate = true;
      }
      std::vector<std::pair<uint32_t, uint32_t>> set;
      while (i_ < s_.size() && s_[i_] != ']') {
        const uint32_t lo = parse_char();
        uint32_t hi = lo;
        if (i_ + 1 < s_.size() && s_[i_] == '-' && s_[i_ + 1] != ']') {
          ++i_;
          hi = parse_char();
          if (hi < lo) fail("class range out of order");
        }
        set.push_back({lo, hi});
      }
      if (i_ >= s_.size()) fail("unterminated character class");
      ++i_;
      std::sort(set.begin(), set.end());
      std::vector<std::pair<uint32_t, uint32_t>> merged;
      for (auto r : set) {
        if (!merged.empty() && r.first <= merged.back().second + 1) merged.back().second = std::max(merged.back().second, r.second);
        else merged.push_back(r);
      }
      if (negate) {
        std::vector<std::pair<uint32_t, uint32_t>> comp;
        uint32_t next = 0;
        for (auto [lo, hi] : merged) {
          if (lo > next) comp.push_back({next, lo - 1});
          next = hi + 1;
        }
        if (next <= 0x10FFFF) comp.push_back({next, 0x10FFFF});
        merged = comp;
      }
      return b_.code_point_set(merged);
    }
    if (c == '(') {
      ++i_;
      ExprId inner = parse_alternatives(depth + 1);
      skip_space();
      if (i_ >= s_.size() || s_[i_] != ')') fail("missing ')'");
      ++i_;
      return inner;
    }
    if (c == '.') {
      ++i_;
      return b_.code_point_range(0, 0x10FFFF);
    }
    if (name_char(c)) return b_.ref(rule(parse_name()));
    fail(std::string("unexpected '") + c + "'");
  }

  GrammarBuilder& b_;
  std::string_view s_;
  size_t i_ = 0;
  std::map<std::string, RuleId> rules_;
  std::map<std::string, bool> defined_;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> compile_ebnf(std::string_view text, const Limits& limits) {
  GrammarBuilder b(limits);
  try {
    EbnfParser p(b, text);
    const RuleId root = p.parse();
    return b.build(root);
  } catch (const EbnfError& e) {
    return make_error(ErrorCode::kInvalidArgument, e.message);
  }
}

}  // namespace strata::grammar
