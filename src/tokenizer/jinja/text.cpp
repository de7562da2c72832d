#include "tokenizer/jinja/text.h"

#include <algorithm>

#include <utf8proc.h>

#include "tokenizer/jinja/failure.h"

namespace strata::tokenizer::jinja {

namespace {

// Invalid UTF-8 bytes decode to lone surrogates U+DC80..U+DCFF (Python's surrogateescape)
// so that they encode back to the same byte.
constexpr uint32_t kEscapeBase = 0xDC00;

std::vector<uint32_t> whitespace_or_chars(const std::optional<std::string>& chars) {
  return chars ? decode_utf8(*chars) : std::vector<uint32_t>{};
}

}  // namespace

void append_utf8(std::string& out, uint32_t cp) {
  if (cp >= 0xDC80 && cp <= 0xDCFF) {
    out += static_cast<char>(cp - kEscapeBase);
  } else if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

std::vector<uint32_t> decode_utf8(const std::string& s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      out.push_back(c);
      ++i;
      continue;
    }
    utf8proc_int32_t cp = 0;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                              static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) {
      out.push_back(kEscapeBase + c);
      ++i;
    } else {
      out.push_back(static_cast<uint32_t>(cp));
      i += static_cast<size_t>(n);
    }
  }
  return out;
}

std::string encode_utf8(const std::vector<uint32_t>& cps) {
  std::string out;
  out.reserve(cps.size());
  for (uint32_t cp : cps) append_utf8(out, cp);
  return out;
}

bool is_ascii(const std::string& s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

size_t codepoint_length(const std::string& s) {
  if (is_ascii(s)) return s.size();
  return decode_utf8(s).size();
}

bool py_isspace(uint32_t cp) {
  if ((cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20)) return true;
  if (cp < 0x80) return false;
  if (cp == 0x85 || cp == 0xA0) return true;
  if (cp >= 0xDC80 && cp <= 0xDCFF) return false;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<uint32_t> cps = decode_utf8(s);
  std::vector<uint32_t> set = whitespace_or_chars(chars);
  auto strip_it = [&](uint32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : py_isspace(cp);
  };
  size_t b = 0;
  size_t e = cps.size();
  if (left) while (b < e && strip_it(cps[b])) ++b;
  if (right) while (e > b && strip_it(cps[e - 1])) --e;
  return encode_utf8(std::vector<uint32_t>(cps.begin() + static_cast<long>(b), cps.begin() + static_cast<long>(e)));
}

std::vector<std::string> py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("ValueError: empty separator");
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      size_t hit = s.find(*sep, start);
      if (hit == std::string::npos) break;
      out.push_back(s.substr(start, hit - start));
      start = hit + sep->size();
    }
    out.push_back(s.substr(start));
    return out;
  }
  std::vector<uint32_t> cps = decode_utf8(s);
  size_t i = 0;
  while (i < cps.size()) {
    while (i < cps.size() && py_isspace(cps[i])) ++i;
    if (i == cps.size()) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(encode_utf8(std::vector<uint32_t>(cps.begin() + static_cast<long>(i), cps.end())));
      return out;
    }
    size_t j = i;
    while (j < cps.size() && !py_isspace(cps[j])) ++j;
    out.push_back(encode_utf8(std::vector<uint32_t>(cps.begin() + static_cast<long>(i), cps.begin() + static_cast<long>(j))));
    i = j;
  }
  return out;
}

std::vector<std::string> py_rsplit(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep) {
    if (sep->empty()) fail("ValueError: empty separator");
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(out.size()) < maxsplit) {
      if (end < sep->size()) break;
      size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == std::string::npos) break;
      out.push_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    out.push_back(s.substr(0, end));
    std::reverse(out.begin(), out.end());
    return out;
  }
  std::vector<uint32_t> cps = decode_utf8(s);
  size_t i = cps.size();
  while (i > 0) {
    while (i > 0 && py_isspace(cps[i - 1])) --i;
    if (i == 0) break;
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
      out.push_back(encode_utf8(std::vector<uint32_t>(cps.begin(), cps.begin() + static_cast<long>(i))));
      break;
    }
    size_t j = i;
    while (j > 0 && !py_isspace(cps[j - 1])) --j;
    out.push_back(encode_utf8(std::vector<uint32_t>(cps.begin() + static_cast<long>(j), cps.begin() + static_cast<long>(i))));
    i = j;
  }
  std::reverse(out.begin(), out.end());
  return out;
}

std::vector<std::string> py_splitlines(const std::string& s, bool keepends) {
  std::vector<uint32_t> cps = decode_utf8(s);
  std::vector<std::string> out;
  size_t start = 0;
  size_t i = 0;
  while (i < cps.size()) {
    uint32_t c = cps[i];
    bool brk = c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || c == 0x1C || c == 0x1D || c == 0x1E ||
               c == 0x85 || c == 0x2028 || c == 0x2029;
    if (!brk) {
      ++i;
      continue;
    }
    size_t eol = i + 1;
    if (c == '\r' && eol < cps.size() && cps[eol] == '\n') ++eol;
    size_t stop = keepends ? eol : i;
    out.push_back(encode_utf8(std::vector<uint32_t>(cps.begin() + static_cast<long>(start), cps.begin() + static_cast<long>(stop))));
    start = i = eol;
  }
  if (start < cps.size()) out.push_back(encode_utf8(std::vector<uint32_t>(cps.begin() + static_cast<long>(start), cps.end())));
  return out;
}

std::string py_upper(const std::string& s) {
  std::vector<uint32_t> cps = decode_utf8(s);
  for (auto& cp : cps) {
    if (cp < 0xDC80 || cp > 0xDCFF) cp = static_cast<uint32_t>(utf8proc_toupper(static_cast<utf8proc_int32_t>(cp)));
  }
  return encode_utf8(cps);
}

std::string py_lower(const std::string& s) {
  std::vector<uint32_t> cps = decode_utf8(s);
  for (auto& cp : cps) {
    if (cp < 0xDC80 || cp > 0xDCFF) cp = static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)));
  }
  return encode_utf8(cps);
}

std::string py_capitalize(const std::string& s) {
  std::vector<uint32_t> cps = decode_utf8(py_lower(s));
  if (!cps.empty()) cps[0] = static_cast<uint32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(cps[0])));
  return encode_utf8(cps);
}

bool py_is_alpha_cp(uint32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z');
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
         cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_LO;
}

bool py_is_digit_cp(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return utf8proc_category(static_cast<utf8proc_int32_t>(cp)) == UTF8PROC_CATEGORY_ND;
}

bool py_is_alnum_cp(uint32_t cp) {
  if (py_is_alpha_cp(cp) || py_is_digit_cp(cp)) return true;
  if (cp < 0x80) return false;
  auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
  return cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
}

std::string py_title(const std::string& s) {
  // A cased letter after an uncased character starts a word (Python str.title()).
  std::vector<uint32_t> cps = decode_utf8(s);
  bool prev_cased = false;
  for (auto& cp : cps) {
    bool cased = py_is_alpha_cp(cp);
    if (cased) {
      auto c = static_cast<utf8proc_int32_t>(cp);
      cp = static_cast<uint32_t>(prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c));
    }
    prev_cased = cased;
  }
  return encode_utf8(cps);
}

std::string py_replace(const std::string& s, const std::string& old_s, const std::string& new_s, int64_t count) {
  std::string out;
  if (old_s.empty()) {
    // Python inserts `new` between every code point and at both ends.
    std::vector<uint32_t> cps = decode_utf8(s);
    int64_t done = 0;
    for (size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += new_s;
        ++done;
      }
      if (i < cps.size()) append_utf8(out, cps[i]);
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t hit = s.find(old_s, start);
    if (hit == std::string::npos) break;
    out.append(s, start, hit - start);
    out += new_s;
    start = hit + old_s.size();
    ++done;
  }
  out.append(s, start, std::string::npos);
  return out;
}

int64_t py_count(const std::string& s, const std::string& sub) {
  if (sub.empty()) return static_cast<int64_t>(codepoint_length(s)) + 1;
  int64_t n = 0;
  size_t start = 0;
  while (true) {
    size_t hit = s.find(sub, start);
    if (hit == std::string::npos) return n;
    ++n;
    start = hit + sub.size();
  }
}

int64_t py_find(const std::string& s, const std::string& sub, bool reverse) {
  size_t hit = reverse ? s.rfind(sub) : s.find(sub);
  if (hit == std::string::npos) return -1;
  return static_cast<int64_t>(codepoint_length(s.substr(0, hit)));
}

}  // namespace strata::tokenizer::jinja
