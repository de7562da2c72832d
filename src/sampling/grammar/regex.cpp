#include "sampling/grammar/regex.h"

#include <algorithm>
#include <string>
#include <vector>

namespace strata::grammar {

namespace {

using CpSet = std::vector<std::pair<uint32_t, uint32_t>>;  // sorted, disjoint, inclusive

CpSet normalize(CpSet s) {
  std::sort(s.begin(), s.end());
  CpSet out;
  for (auto r : s) {
    if (!out.empty() && r.first <= out.back().second + 1) out.back().second = std::max(out.back().second, r.second);
    else out.push_back(r);
  }
  return out;
}

CpSet complement(const CpSet& s) {
  CpSet out;
  uint32_t next = 0;
  for (auto [lo, hi] : s) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

CpSet subtract(const CpSet& a, const CpSet& b) {
  CpSet out;
  const CpSet nb = complement(b);
  for (auto [lo, hi] : a)
    for (auto [x, y] : nb) {
      const uint32_t l = std::max(lo, x), h = std::min(hi, y);
      if (l <= h) out.push_back({l, h});
    }
  return normalize(out);
}

const CpSet kDigit = {{'0', '9'}};
const CpSet kWord = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const CpSet kSpace = {{0x09, 0x0D}, {0x20, 0x20}, {0xA0, 0xA0}, {0x1680, 0x1680}, {0x2000, 0x200A},
                      {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
const CpSet kDot = complement({{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}});

struct RegexError {
  std::string message;
};

// Emits a set of code points, in JSON-string form when asked.
ExprId emit_set(GrammarBuilder& b, const CpSet& set, bool json) {
  if (!json) return b.code_point_set(set);
  const CpSet special = {{0x00, 0x1F}, {'"', '"'}, {'\\', '\\'}};
  std::vector<ExprId> alts;
  const CpSet safe = subtract(set, special);
  if (!safe.empty()) alts.push_back(b.code_point_set(safe));
  auto has = [&](uint32_t c) {
    for (auto [lo, hi] : set)
      if (lo <= c && c <= hi) return true;
    return false;
  };
  static const char* kHex = "0123456789abcdef";
  for (uint32_t c = 0; c < 0x20; ++c) {
    if (!has(c)) continue;
    std::vector<ExprId> forms;
    const char* shorts = c == 8 ? "b" : c == 9 ? "t" : c == 10 ? "n" : c == 12 ? "f" : c == 13 ? "r" : nullptr;
    if (shorts) forms.push_back(b.literal(std::string("\\") + shorts));
    ByteSet hi, lo;
    hi.add(uint8_t(kHex[c >> 4]));
    lo.add(uint8_t(kHex[c & 15]));
    if (kHex[c & 15] >= 'a') lo.add(uint8_t(kHex[c & 15] - 'a' + 'A'));
    forms.push_back(b.seq({b.literal("\\u00"), b.bytes(hi), b.bytes(lo)}));
    alts.push_back(b.alt(std::move(forms)));
  }
  if (has('"')) alts.push_back(b.literal("\\\""));
  if (has('\\')) alts.push_back(b.literal("\\\\"));
  return b.alt(std::move(alts));
}

class RegexParser {
 public:
  RegexParser(GrammarBuilder& b, std::string_view p, const RegexMode& mode) : b_(b), p_(p), mode_(mode) {}

  ExprId parse_top() {
    std::vector<ExprId> alts;
    for (;;) {
      bool anchored_start = false, anchored_end = false;
      if (peek('^')) {
        ++i_;
        anchored_start = true;
      }
      ExprId body = parse_seq(true, &anchored_end);
      if (mode_.search) {
        const ExprId any = b_.star(emit_set(b_, complement({}), mode_.json_string));
        body = b_.seq({anchored_start ? b_.empty() : any, body, anchored_end ? b_.empty() : any});
      }
      alts.push_back(body);
      if (i_ >= p_.size()) break;
      if (p_[i_] == '|') {
        ++i_;
        continue;
      }
      fail("unmatched ')'");
    }
    return b_.alt(std::move(alts));
  }

 private:
  [[noreturn]] void fail(const std::string& what) {
    throw RegexError{"regex: " + what + " at offset " + std::to_string(i_) + " in '" + std::string(p_) + "'"};
  }
  bool peek(char c) const { return i_ < p_.size() && p_[i_] == c; }

  ExprId parse_alt() {
    if (++depth_ > 200) fail("groups nested too deeply");
    std::vector<ExprId> alts{parse_seq(false, nullptr)};
    while (peek('|')) {
      ++i_;
      alts.push_back(parse_seq(false, nullptr));
    }
    --depth_;
    return b_.alt(std::move(alts));
  }

  // top: a top-level alternative, where a final `$` anchors.
  ExprId parse_seq(bool top, bool* anchored_end) {
    std::vector<ExprId> items;
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      if (p_[i_] == '$') {
        if (top && (i_ + 1 == p_.size() || p_[i_ + 1] == '|')) {
          ++i_;
          *anchored_end = true;
          break;
        }
        fail("'$' not at the end of the pattern");
      }
      if (p_[i_] == '^') fail("'^' not at the start of the pattern");
      ExprId atom = parse_atom();
      items.push_back(parse_quantifier(atom));
    }
    return b_.seq(std::move(items));
  }

  bool parse_int(int& v) {
    size_t j = i_;
    long long x = 0;
    while (j < p_.size() && p_[j] >= '0' && p_[j] <= '9' && x < 1000000) x = x * 10 + (p_[j++] - '0');
    if (j == i_) return false;
    v = static_cast<int>(std::min(x, 1000000LL));
    i_ = j;
    return true;
  }

  ExprId parse_quantifier(ExprId atom) {
    if (i_ >= p_.size()) return atom;
    int lo = 0, hi = -1;
    const char c = p_[i_];
    if (c == '*') {
      ++i_;
    } else if (c == '+') {
      ++i_;
      lo = 1;
    } else if (c == '?') {
      ++i_;
      hi = 1;
    } else if (c == '{') {
      const size_t save = i_++;
      if (!parse_int(lo)) {
        i_ = save;  // a literal brace (Annex B)
        return atom;
      }
      hi = lo;
      if (peek(',')) {
        ++i_;
        hi = -1;
        if (!peek('}') && !parse_int(hi)) fail("bad {m,n} quantifier");
      }
      if (!peek('}')) fail("bad {m,n} quantifier");
      ++i_;
      if (hi >= 0 && hi < lo) fail("quantifier {" + std::to_string(lo) + "," + std::to_string(hi) + "} has max < min");
    } else {
      return atom;
    }
    if (peek('?')) ++i_;  // lazy: same language
    if (i_ < p_.size() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?')) fail("nothing to repeat");
    return b_.repeat(atom, lo, hi);
  }

  uint32_t next_code_point() {
    const auto c = static_cast<uint8_t>(p_[i_]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i_ + n > p_.size()) fail("invalid UTF-8");
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<uint8_t>(p_[i_ + k]) & 0x3F);
    i_ += n;
    return cp;
  }

  uint32_t parse_hex(int digits) {
    uint32_t v = 0;
    for (int k = 0; k < digits; ++k) {
      if (i_ >= p_.size() || !isxdigit(static_cast<unsigned char>(p_[i_]))) fail("bad hex escape");
      const char h = p_[i_++];
      v = v * 16 + (h <= '9' ? h - '0' : (h | 0x20) - 'a' + 10);
    }
    return v;
  }

  // An escape after the backslash; in_class changes \b. Returns a set.
  CpSet parse_escape(bool in_class) {
    if (i_ >= p_.size()) fail("trailing backslash");
    const char c = p_[i_++];
    switch (c) {
      case 'd': return kDigit;
      case 'D': return complement(kDigit);
      case 'w': return kWord;
      case 'W': return complement(kWord);
      case 's': return kSpace;
      case 'S': return complement(kSpace);
      case 't': return {{9, 9}};
      case 'n': return {{10, 10}};
      case 'v': return {{11, 11}};
      case 'f': return {{12, 12}};
      case 'r': return {{13, 13}};
      case 'b':
        if (in_class) return {{8, 8}};
        --i_;
        fail("word boundary \\b is not supported");
      case 'B': --i_; fail("word boundary \\B is not supported");
      case '0':
        if (i_ < p_.size() && isdigit(static_cast<unsigned char>(p_[i_]))) fail("octal escape is not supported");
        return {{0, 0}};
      case 'x': {
        const uint32_t v = parse_hex(2);
        return {{v, v}};
      }
      case 'u': {
        uint32_t v;
        if (peek('{')) {
          ++i_;
          v = 0;
          int n = 0;
          while (i_ < p_.size() && p_[i_] != '}' && n < 7) {
            v = v * 16 + parse_hex(1);
            ++n;
          }
          if (!peek('}') || n == 0 || v > 0x10FFFF) fail("bad \\u{...} escape");
          ++i_;
        } else {
          v = parse_hex(4);
        }
        return {{v, v}};
      }
      case 'c': {
        if (i_ >= p_.size() || !isalpha(static_cast<unsigned char>(p_[i_]))) fail("bad \\c escape");
        const uint32_t v = static_cast<uint32_t>(p_[i_++]) % 32;
        return {{v, v}};
      }
      case 'k': --i_; fail("backreference \\k is not supported");
      case 'p':
      case 'P': --i_; fail("Unicode property escape is not supported");
      default:
        if (c >= '1' && c <= '9') {
          --i_;
          fail("backreference is not supported");
        }
        --i_;
        const uint32_t v = next_code_point();
        return {{v, v}};
    }
  }

  ExprId parse_class() {
    const size_t open = i_ - 1;
    bool negate = false;
    if (peek('^')) {
      ++i_;
      negate = true;
    }
    CpSet set;
    while (!peek(']')) {
      if (i_ >= p_.size()) {
        i_ = open;
        fail("unterminated character class");
      }
      auto item = [&]() -> CpSet {
        if (p_[i_] == '\\') {
          ++i_;
          return parse_escape(true);
        }
        const uint32_t v = next_code_point();
        return {{v, v}};
      };
      CpSet lo = item();
      if (peek('-') && i_ + 1 < p_.size() && p_[i_ + 1] != ']') {
        ++i_;
        CpSet hi = item();
        if (lo.size() != 1 || hi.size() != 1 || lo[0].first != lo[0].second || hi[0].first != hi[0].second)
          fail("class range with a class escape as an end");
        if (hi[0].first < lo[0].first) fail("class range out of order");
        set.push_back({lo[0].first, hi[0].first});
      } else {
        set.insert(set.end(), lo.begin(), lo.end());
      }
    }
    ++i_;
    set = normalize(set);
    if (negate) set = complement(set);
    return emit_set(b_, set, mode_.json_string);
  }

  ExprId parse_atom() {
    const char c = p_[i_];
    if (c == '(') {
      ++i_;
      if (peek('?')) {
        ++i_;
        if (peek(':')) {
          ++i_;
        } else if (peek('<') && i_ + 1 < p_.size() && p_[i_ + 1] != '=' && p_[i_ + 1] != '!') {
          while (i_ < p_.size() && p_[i_] != '>') ++i_;
          if (!peek('>')) fail("unterminated group name");
          ++i_;
        } else {
          fail("lookaround and inline flags are not supported");
        }
      }
      ExprId inner = parse_alt();
      if (!peek(')')) fail("missing ')'");
      ++i_;
      return inner;
    }
    if (c == '[') {
      ++i_;
      return parse_class();
    }
    if (c == '.') {
      ++i_;
      return emit_set(b_, kDot, mode_.json_string);
    }
    if (c == '*' || c == '+' || c == '?') fail("nothing to repeat");
    if (c == '\\') {
      ++i_;
      return emit_set(b_, parse_escape(false), mode_.json_string);
    }
    const uint32_t v = next_code_point();
    return emit_set(b_, {{v, v}}, mode_.json_string);
  }

  GrammarBuilder& b_;
  std::string_view p_;
  RegexMode mode_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<ExprId> regex_to_expr(GrammarBuilder& b, std::string_view pattern, const RegexMode& mode) {
  try {
    RegexParser parser(b, pattern, mode);
    return parser.parse_top();
  } catch (const RegexError& e) {
    return make_error(ErrorCode::kInvalidArgument, e.message);
  }
}

ExprId json_string_char(GrammarBuilder& b) {
  ByteSet esc, hex;
  for (char c : std::string_view("\"\\/bfnrt")) esc.add(uint8_t(c));
  hex.add_range('0', '9');
  hex.add_range('a', 'f');
  hex.add_range('A', 'F');
  const ExprId unescaped = b.code_point_set(subtract(complement({}), {{0x00, 0x1F}, {'"', '"'}, {'\\', '\\'}}));
  return b.alt({unescaped, b.seq({b.literal("\\"), b.alt({b.bytes(esc), b.seq({b.literal("u"), b.repeat(b.bytes(hex), 4, 4)})})})});
}

}  // namespace strata::grammar
