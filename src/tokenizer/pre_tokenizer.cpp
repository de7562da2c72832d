#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <functional>
#include <utility>

#include <nlohmann/json.hpp>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace strata::tokenizer {
namespace {

using json = nlohmann::json;
using Spans = std::vector<std::pair<size_t, size_t>>;

enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct Piece {
  size_t start, end;
  bool is_match;
};

// Cuts `word` at the matched spans (sorted, disjoint) following `behavior`, appending the
// non-empty pieces to `out`.
void split_word(const std::string& word, const Spans& matches, Behavior behavior, bool invert,
                std::vector<std::string>& out) {
  std::vector<Piece> pieces;
  pieces.reserve(matches.size() * 2 + 1);
  size_t prev = 0;
  for (const auto& [s, e] : matches) {
    if (prev < s) pieces.push_back({prev, s, false});
    pieces.push_back({s, e, true});
    prev = e;
  }
  if (prev < word.size()) pieces.push_back({prev, word.size(), false});
  if (invert) {
    for (auto& p : pieces) p.is_match = !p.is_match;
  }
  std::vector<Piece> merged;
  merged.reserve(pieces.size());
  switch (behavior) {
    case Behavior::kRemoved:
      for (const auto& p : pieces) {
        if (!p.is_match) merged.push_back(p);
      }
      break;
    case Behavior::kIsolated:
      merged = pieces;
      break;
    case Behavior::kContiguous: {
      bool previous = false;
      for (const auto& p : pieces) {
        if (!merged.empty() && p.is_match == previous) {
          merged.back().end = p.end;
        } else {
          merged.push_back(p);
        }
        previous = p.is_match;
      }
      break;
    }
    case Behavior::kMergedWithPrevious: {
      bool previous = false;
      for (const auto& p : pieces) {
        if (p.is_match && !previous && !merged.empty()) {
          merged.back().end = p.end;
        } else {
          merged.push_back(p);
        }
        previous = p.is_match;
      }
      break;
    }
    case Behavior::kMergedWithNext: {
      bool previous = false;
      for (auto it = pieces.rbegin(); it != pieces.rend(); ++it) {
        if (it->is_match && !previous && !merged.empty()) {
          merged.back().start = it->start;
        } else {
          merged.push_back(*it);
        }
        previous = it->is_match;
      }
      std::reverse(merged.begin(), merged.end());
      break;
    }
  }
  for (const auto& p : merged) {
    if (p.end > p.start) out.emplace_back(word, p.start, p.end - p.start);
  }
}

// Spans of every single character for which `pred` holds (the Rust char-pattern matcher).
void find_chars(const std::string& word, const std::function<bool(uint32_t)>& pred, Spans& out) {
  size_t pos = 0;
  while (pos < word.size()) {
    const size_t start = pos;
    if (pred(next_code_point(word, pos))) out.emplace_back(start, pos);
  }
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex regex, Behavior behavior, bool invert)
      : regex_(std::move(regex)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<std::string>& words, bool) const override {
    std::vector<std::string> out;
    Spans matches;
    for (const auto& w : words) {
      matches.clear();
      regex_.find_all(w, matches);
      split_word(w, matches, behavior_, invert_, out);
    }
    words = std::move(out);
  }

 private:
  Regex regex_;
  Behavior behavior_;
  bool invert_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, std::unique_ptr<Regex> regex)
      : add_prefix_space_(add_prefix_space), regex_(std::move(regex)) {}
  void pre_tokenize(std::vector<std::string>& words, bool) const override {
    if (add_prefix_space_) {
      for (auto& w : words) {
        if (w.empty() || w[0] != ' ') w = " " + w;
      }
    }
    if (regex_) {
      std::vector<std::string> out;
      Spans matches;
      for (const auto& w : words) {
        matches.clear();
        regex_->find_all(w, matches);
        split_word(w, matches, Behavior::kIsolated, false, out);
      }
      words = std::move(out);
    }
  }
  bool byte_level() const override { return true; }

 private:
  bool add_prefix_space_;
  std::unique_ptr<Regex> regex_;  // the GPT-2 pattern when use_regex
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  MetaspacePreTokenizer(std::string replacement, PrependScheme scheme, bool split)
      : replacement_(std::move(replacement)), scheme_(scheme), split_(split) {}
  void pre_tokenize(std::vector<std::string>& words, bool at_text_start) const override {
    std::vector<std::string> out;
    Spans matches;
    for (size_t i = 0; i < words.size(); ++i) {
      std::string w;
      w.reserve(words[i].size() + replacement_.size());
      for (char c : words[i]) {
        if (c == ' ') {
          w += replacement_;
        } else {
          w.push_back(c);
        }
      }
      const bool starts = w.compare(0, replacement_.size(), replacement_) == 0;
      const bool prepend = scheme_ == PrependScheme::kAlways || (scheme_ == PrependScheme::kFirst && at_text_start && i == 0);
      if (prepend && !starts) w.insert(0, replacement_);
      if (split_) {
        matches.clear();
        size_t pos = 0;
        while ((pos = w.find(replacement_, pos)) != std::string::npos) {
          matches.emplace_back(pos, pos + replacement_.size());
          pos += replacement_.size();
        }
        split_word(w, matches, Behavior::kMergedWithNext, false, out);
      } else if (!w.empty()) {
        out.push_back(std::move(w));
      }
    }
    words = std::move(out);
  }

 private:
  std::string replacement_;
  PrependScheme scheme_;
  bool split_;
};

class CharClassPreTokenizer final : public PreTokenizer {
 public:
  CharClassPreTokenizer(std::function<bool(uint32_t)> pred, Behavior behavior, bool invert)
      : pred_(std::move(pred)), behavior_(behavior), invert_(invert) {}
  void pre_tokenize(std::vector<std::string>& words, bool) const override {
    std::vector<std::string> out;
    Spans matches;
    for (const auto& w : words) {
      matches.clear();
      find_chars(w, pred_, matches);
      split_word(w, matches, behavior_, invert_, out);
    }
    words = std::move(out);
  }

 private:
  std::function<bool(uint32_t)> pred_;
  Behavior behavior_;
  bool invert_;
};

// Keeps only the regex matches (the Whitespace pre-tokenizer: `\w+|[^\w\s]+`).
class KeepMatchesPreTokenizer final : public PreTokenizer {
 public:
  explicit KeepMatchesPreTokenizer(Regex regex) : regex_(std::move(regex)) {}
  void pre_tokenize(std::vector<std::string>& words, bool) const override {
    std::vector<std::string> out;
    Spans matches;
    for (const auto& w : words) {
      matches.clear();
      regex_.find_all(w, matches);
      for (const auto& [s, e] : matches) out.emplace_back(w, s, e - s);
    }
    words = std::move(out);
  }

 private:
  Regex regex_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> parts) : parts_(std::move(parts)) {}
  void pre_tokenize(std::vector<std::string>& words, bool at_text_start) const override {
    for (const auto& p : parts_) p->pre_tokenize(words, at_text_start);
  }
  bool byte_level() const override { return !parts_.empty() && parts_.back()->byte_level(); }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

Result<Behavior> parse_behavior(const json& spec) {
  const std::string b = spec.value("behavior", std::string("Isolated"));
  if (b == "Removed") return Behavior::kRemoved;
  if (b == "Isolated") return Behavior::kIsolated;
  if (b == "MergedWithPrevious") return Behavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return Behavior::kMergedWithNext;
  if (b == "Contiguous") return Behavior::kContiguous;
  return make_error(ErrorCode::kUnsupported, "tokenizer.json Split behavior '" + b + "' is not supported");
}

constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

std::unique_ptr<PreTokenizer> make_metaspace(const std::string& replacement, PrependScheme scheme, bool split) {
  return std::make_unique<MetaspacePreTokenizer>(replacement, scheme, split);
}

Result<std::unique_ptr<PreTokenizer>> parse_pre_tokenizer(const json& spec) {
  if (spec.is_null()) return std::unique_ptr<PreTokenizer>();
  if (!spec.is_object() || !spec.contains("type")) {
    return make_error(ErrorCode::kCorrupt, "tokenizer.json pre_tokenizer: expected an object with a type");
  }
  const std::string type = spec.at("type").get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<PreTokenizer>> parts;
    const auto& list = spec.at("pretokenizers");
    for (size_t i = 0; i < list.size(); ++i) {
      auto p = parse_pre_tokenizer(list[i]);
      if (!p.ok()) return p.error();
      if (!*p) continue;
      if ((*p)->byte_level() && i + 1 != list.size()) {
        return make_error(ErrorCode::kUnsupported, "tokenizer.json pre_tokenizer: ByteLevel must be the last stage");
      }
      parts.push_back(std::move(*p));
    }
    return std::unique_ptr<PreTokenizer>(new SequencePreTokenizer(std::move(parts)));
  }
  if (type == "Split") {
    const auto& pat = spec.at("pattern");
    const bool literal = pat.contains("String");
    auto re = Regex::compile(literal ? pat.at("String").get<std::string>() : pat.at("Regex").get<std::string>(), literal);
    if (!re.ok()) return make_error(ErrorCode::kInvalidArgument, "tokenizer.json pre_tokenizer Split: " + re.error().message);
    auto behavior = parse_behavior(spec);
    if (!behavior.ok()) return behavior.error();
    return std::unique_ptr<PreTokenizer>(new SplitPreTokenizer(std::move(*re), *behavior, spec.value("invert", false)));
  }
  if (type == "ByteLevel") {
    std::unique_ptr<Regex> regex;
    if (spec.value("use_regex", true)) {
      auto re = Regex::compile(kGpt2Pattern);
      if (!re.ok()) return re.error();
      regex = std::make_unique<Regex>(std::move(*re));
    }
    return std::unique_ptr<PreTokenizer>(new ByteLevelPreTokenizer(spec.value("add_prefix_space", true), std::move(regex)));
  }
  if (type == "Metaspace") {
    PrependScheme scheme = PrependScheme::kAlways;
    if (spec.contains("prepend_scheme") && spec["prepend_scheme"].is_string()) {
      const std::string s = spec["prepend_scheme"].get<std::string>();
      if (s == "first") {
        scheme = PrependScheme::kFirst;
      } else if (s == "never") {
        scheme = PrependScheme::kNever;
      } else if (s != "always") {
        return make_error(ErrorCode::kUnsupported, "tokenizer.json Metaspace prepend_scheme '" + s + "'");
      }
    } else if (spec.contains("add_prefix_space")) {
      scheme = spec["add_prefix_space"].get<bool>() ? PrependScheme::kAlways : PrependScheme::kNever;
    }
    return make_metaspace(spec.value("replacement", std::string("\xE2\x96\x81")), scheme, spec.value("split", true));
  }
  if (type == "Digits") {
    const bool individual = spec.value("individual_digits", false);
    return std::unique_ptr<PreTokenizer>(new CharClassPreTokenizer(
        is_numeric_char, individual ? Behavior::kIsolated : Behavior::kContiguous, false));
  }
  if (type == "WhitespaceSplit") {
    return std::unique_ptr<PreTokenizer>(new CharClassPreTokenizer(is_unicode_whitespace, Behavior::kRemoved, false));
  }
  if (type == "Whitespace") {
    auto re = Regex::compile(R"(\w+|[^\w\s]+)");
    if (!re.ok()) return re.error();
    return std::unique_ptr<PreTokenizer>(new KeepMatchesPreTokenizer(std::move(*re)));
  }
  return make_error(ErrorCode::kUnsupported, "tokenizer.json pre_tokenizer type '" + type + "' is not supported");
}

}  // namespace strata::tokenizer
