#include "tokenizer/normalizer.h"

#include <cstdlib>
#include <vector>

#include <nlohmann/json.hpp>
#include <utf8proc.h>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace strata::tokenizer {
namespace {

using json = nlohmann::json;

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> parts) : parts_(std::move(parts)) {}
  void normalize(std::string& text) const override {
    for (const auto& p : parts_) p->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string prefix) : prefix_(std::move(prefix)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);  // an empty string stays empty
  }

 private:
  std::string prefix_;
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    pattern_.find_all(text, matches);
    if (matches.empty()) return;
    std::string out;
    out.reserve(text.size() + matches.size() * content_.size());
    size_t prev = 0;
    for (const auto& [s, e] : matches) {
      out.append(text, prev, s - prev);
      out.append(content_);
      prev = e;
    }
    out.append(text, prev, std::string::npos);
    text = std::move(out);
  }

 private:
  Regex pattern_;
  std::string content_;
};

class UnicodeNormalizer final : public Normalizer {
 public:
  explicit UnicodeNormalizer(NormalForm form) : form_(form) {
    if (form == NormalForm::kNfc) (void)is_nfc_inert(0x300);  // build the table at load, not on a request
  }
  void normalize(std::string& text) const override { text = normalize_unicode(text, form_); }

 private:
  NormalForm form_;
};

class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    size_t pos = 0;
    while (pos < text.size()) {
      const uint32_t cp = next_code_point(text, pos);
      if (cp < 0x80) {
        out.push_back(static_cast<char>(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp));
      } else if (cp == 0x130) {
        // The one unconditional multi-character lowercase mapping: I WITH DOT ABOVE.
        out.append("i\xCC\x87");
      } else {
        append_utf8(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))));
      }
    }
    text = std::move(out);
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t begin = 0, end = text.size();
    if (left_) {
      size_t pos = 0;
      while (pos < text.size()) {
        size_t next = pos;
        if (!is_unicode_whitespace(next_code_point(text, next))) break;
        pos = next;
      }
      begin = pos;
    }
    if (right_) {
      // Walk forward remembering where the trailing whitespace run starts.
      size_t pos = begin, run = std::string::npos;
      while (pos < end) {
        size_t next = pos;
        const bool ws = is_unicode_whitespace(next_code_point(text, next));
        if (ws && run == std::string::npos) run = pos;
        if (!ws) run = std::string::npos;
        pos = next;
      }
      if (run != std::string::npos) end = run;
    }
    text = text.substr(begin, end - begin);
  }

 private:
  bool left_, right_;
};

}  // namespace

namespace {

bool is_second_element(const utf8proc_property_t* p) {
  // utf8proc flags second elements of compositions with bit 15 of comb_index.
  return p->comb_index != UINT16_MAX && (p->comb_index & 0x8000) != 0;
}

bool compute_nfc_inert(uint32_t cp) {
  if (cp < 0x300) return true;
  if (cp >= 0xD800 && cp <= 0xDFFF) return false;
  const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
  if (p->combining_class != 0 || is_second_element(p)) return false;
  // Hangul vowel and trailing jamo compose algorithmically, outside utf8proc's tables.
  if ((cp >= 0x1161 && cp <= 0x1175) || (cp >= 0x11A8 && cp <= 0x11C2)) return false;
  if (p->decomp_seqindex != UINT16_MAX && p->decomp_type == 0) {
    // Canonically decomposable: inert only when NFC gives it back (no exclusion or
    // singleton) and its decomposition does not open with a second element.
    utf8proc_int32_t buf[8];
    int last_class = 0;
    const auto n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), buf, 8, UTF8PROC_DECOMPOSE, &last_class);
    if (n < 1 || n > 8) return false;
    const utf8proc_property_t* first = utf8proc_get_property(buf[0]);
    if (first->combining_class != 0 || is_second_element(first)) return false;
    std::string one;
    append_utf8(one, cp);
    utf8proc_uint8_t* out = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(one.c_str()));
    const bool same = out != nullptr && one == reinterpret_cast<const char*>(out);
    std::free(out);
    return same;
  }
  return true;
}

// One bit per code point, computed once (a few milliseconds) on first use.
const std::vector<uint64_t>& nfc_inert_bits() {
  static const std::vector<uint64_t> bits = [] {
    std::vector<uint64_t> b(0x110000 / 64, 0);
    for (uint32_t cp = 0; cp < 0x110000; ++cp) {
      if (compute_nfc_inert(cp)) b[cp >> 6] |= uint64_t{1} << (cp & 63);
    }
    return b;
  }();
  return bits;
}

}  // namespace

bool is_nfc_inert(uint32_t cp) {
  if (cp < 0x300) return true;
  if (cp >= 0x110000) return false;
  return (nfc_inert_bits()[cp >> 6] >> (cp & 63)) & 1;
}

namespace {

std::string utf8proc_normalize(std::string_view text, NormalForm form) {
  int options = UTF8PROC_STABLE;
  switch (form) {
    case NormalForm::kNfc: options |= UTF8PROC_COMPOSE; break;
    case NormalForm::kNfd: options |= UTF8PROC_DECOMPOSE; break;
    case NormalForm::kNfkc: options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    case NormalForm::kNfkd: options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
  }
  utf8proc_uint8_t* out = nullptr;
  const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                              static_cast<utf8proc_ssize_t>(text.size()), &out,
                              static_cast<utf8proc_option_t>(options));
  if (n < 0) return std::string(text);  // input is validated before normalization; keep it as is
  std::string result(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return result;
}

}  // namespace

std::string normalize_unicode(const std::string& text, NormalForm form) {
  if (form != NormalForm::kNfc) {
    // No code point below U+00A0 changes under any form.
    for (size_t pos = 0; pos < text.size();) {
      if (static_cast<unsigned char>(text[pos]) < 0x80) {
        ++pos;
      } else if (next_code_point(text, pos) >= 0xA0) {
        return utf8proc_normalize(text, form);
      }
    }
    return text;
  }
  // NFC is local: an inert code point neither changes nor combines with what precedes it,
  // so only the stretches from the starter before a non-inert code point up to the next
  // inert one go through utf8proc.
  std::string out;
  size_t copied = 0;        // text[0, copied) is already in out
  size_t prev_start = 0;    // start of the previous code point
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    if (static_cast<unsigned char>(text[pos]) < 0x80) {
      ++pos;
      prev_start = start;
      continue;
    }
    if (is_nfc_inert(next_code_point(text, pos))) {
      prev_start = start;
      continue;
    }
    const size_t run_start = start > copied ? prev_start : start;  // include the base it may compose with
    size_t run_end = pos;
    while (run_end < text.size()) {
      size_t next = run_end;
      if (static_cast<unsigned char>(text[run_end]) < 0x80 ? true : is_nfc_inert(next_code_point(text, next))) break;
      run_end = next;
    }
    if (out.empty()) out.reserve(text.size() + 16);
    out.append(text, copied, run_start - copied);
    out += utf8proc_normalize(std::string_view(text).substr(run_start, run_end - run_start), form);
    copied = run_end;
    pos = run_end;
    prev_start = run_end;
  }
  if (copied == 0) return text;
  out.append(text, copied, std::string::npos);
  return out;
}

Result<std::unique_ptr<Normalizer>> parse_normalizer(const json& spec) {
  if (spec.is_null()) return std::unique_ptr<Normalizer>();
  if (!spec.is_object() || !spec.contains("type")) {
    return make_error(ErrorCode::kCorrupt, "tokenizer.json normalizer: expected an object with a type");
  }
  const std::string type = spec.at("type").get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Normalizer>> parts;
    for (const auto& p : spec.at("normalizers")) {
      auto n = parse_normalizer(p);
      if (!n.ok()) return n.error();
      if (*n) parts.push_back(std::move(*n));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(parts)));
  }
  if (type == "Prepend") return std::unique_ptr<Normalizer>(new PrependNormalizer(spec.at("prepend").get<std::string>()));
  if (type == "Replace") {
    const auto& pat = spec.at("pattern");
    const bool literal = pat.contains("String");
    auto re = Regex::compile(literal ? pat.at("String").get<std::string>() : pat.at("Regex").get<std::string>(), literal);
    if (!re.ok()) return make_error(ErrorCode::kInvalidArgument, "tokenizer.json normalizer Replace: " + re.error().message);
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(*re), spec.at("content").get<std::string>()));
  }
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfc));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfd));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfkc));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(NormalForm::kNfkd));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer());
  if (type == "Strip") {
    return std::unique_ptr<Normalizer>(
        new StripNormalizer(spec.value("strip_left", true), spec.value("strip_right", true)));
  }
  return make_error(ErrorCode::kUnsupported, "tokenizer.json normalizer type '" + type + "' is not supported");
}

}  // namespace strata::tokenizer
