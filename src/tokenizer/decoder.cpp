#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include "tokenizer/regex.h"
#include "tokenizer/unicode.h"

namespace strata::tokenizer {
namespace {

using json = nlohmann::json;

class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string bytes;
    for (const auto& t : tokens) {
      // A token with any character outside the byte alphabet contributes its raw UTF-8.
      const size_t mark = bytes.size();
      bool mapped = true;
      size_t pos = 0;
      while (pos < t.size()) {
        const int b = unicode_to_byte(next_code_point(t, pos));
        if (b < 0) {
          mapped = false;
          break;
        }
        bytes.push_back(static_cast<char>(b));
      }
      if (!mapped) {
        bytes.resize(mark);
        bytes.append(t);
      }
    }
    tokens.assign(1, utf8_lossy(bytes));
  }
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string replacement, bool prepend) : replacement_(std::move(replacement)), prepend_(prepend) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string out;
      const std::string& t = tokens[i];
      size_t pos = 0;
      while (pos < t.size()) {
        if (t.compare(pos, replacement_.size(), replacement_) == 0) {
          // Every replacement in the first token is dropped when a prefix was prepended.
          if (!(i == 0 && prepend_)) out.push_back(' ');
          pos += replacement_.size();
        } else {
          out.push_back(t[pos++]);
        }
      }
      tokens[i] = std::move(out);
    }
  }

 private:
  std::string replacement_;
  bool prepend_;
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::string> out;
    out.reserve(tokens.size());
    std::string pending;  // bytes of consecutive <0xXX> tokens
    size_t pending_count = 0;
    auto flush = [&] {
      if (pending_count == 0) return;
      if (!find_invalid_utf8(pending)) {
        out.push_back(pending);
      } else {
        // Invalid bytes: one U+FFFD per byte token, as the reference does.
        for (size_t i = 0; i < pending_count; ++i) out.emplace_back("\xEF\xBF\xBD");
      }
      pending.clear();
      pending_count = 0;
    };
    for (auto& t : tokens) {
      int byte = -1;
      if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') byte = parse_hex(t[3], t[4]);
      if (byte >= 0) {
        pending.push_back(static_cast<char>(byte));
        ++pending_count;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens = std::move(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  static int parse_hex(char hi, char lo) {
    const int h = hex(hi), l = hex(lo);
    return (h < 0 || l < 0) ? -1 : h * 16 + l;
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::string joined;
    for (const auto& t : tokens) joined += t;
    tokens.assign(1, std::move(joined));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (auto& t : tokens) {
      size_t begin = 0, end = t.size();
      for (size_t i = 0; i < start_ && t.compare(begin, content_.size(), content_) == 0 && begin < end; ++i) {
        begin += content_.size();
      }
      for (size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                         t.compare(end - content_.size(), content_.size(), content_) == 0;
           ++i) {
        end -= content_.size();
      }
      t = t.substr(begin, end - begin);
    }
  }

 private:
  std::string content_;  // one character
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex pattern, std::string content) : pattern_(std::move(pattern)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    std::vector<std::pair<size_t, size_t>> matches;
    for (auto& t : tokens) {
      matches.clear();
      pattern_.find_all(t, matches);
      if (matches.empty()) continue;
      std::string out;
      size_t prev = 0;
      for (const auto& [s, e] : matches) {
        out.append(t, prev, s - prev);
        out += content_;
        prev = e;
      }
      out.append(t, prev, std::string::npos);
      t = std::move(out);
    }
  }

 private:
  Regex pattern_;
  std::string content_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> parts) : parts_(std::move(parts)) {}
  void decode_chain(std::vector<std::string>& tokens) const override {
    for (const auto& p : parts_) p->decode_chain(tokens);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> parts_;
};

}  // namespace

Result<std::unique_ptr<Decoder>> parse_decoder(const json& spec) {
  if (spec.is_null()) return std::unique_ptr<Decoder>();
  if (!spec.is_object() || !spec.contains("type")) {
    return make_error(ErrorCode::kCorrupt, "tokenizer.json decoder: expected an object with a type");
  }
  const std::string type = spec.at("type").get<std::string>();
  if (type == "Sequence") {
    std::vector<std::unique_ptr<Decoder>> parts;
    for (const auto& p : spec.at("decoders")) {
      auto d = parse_decoder(p);
      if (!d.ok()) return d.error();
      if (*d) parts.push_back(std::move(*d));
    }
    return std::unique_ptr<Decoder>(new SequenceDecoder(std::move(parts)));
  }
  if (type == "ByteLevel") return std::unique_ptr<Decoder>(new ByteLevelDecoder());
  if (type == "Metaspace") {
    bool prepend = true;
    if (spec.contains("prepend_scheme") && spec["prepend_scheme"].is_string()) {
      prepend = spec["prepend_scheme"].get<std::string>() != "never";
    } else if (spec.contains("add_prefix_space")) {
      prepend = spec["add_prefix_space"].get<bool>();
    }
    return std::unique_ptr<Decoder>(new MetaspaceDecoder(spec.value("replacement", std::string("\xE2\x96\x81")), prepend));
  }
  if (type == "ByteFallback") return std::unique_ptr<Decoder>(new ByteFallbackDecoder());
  if (type == "Fuse") return std::unique_ptr<Decoder>(new FuseDecoder());
  if (type == "Strip") {
    return std::unique_ptr<Decoder>(new StripDecoder(spec.value("content", std::string(" ")), spec.value("start", size_t{0}),
                                                     spec.value("stop", size_t{0})));
  }
  if (type == "Replace") {
    const auto& pat = spec.at("pattern");
    const bool literal = pat.contains("String");
    auto re = Regex::compile(literal ? pat.at("String").get<std::string>() : pat.at("Regex").get<std::string>(), literal);
    if (!re.ok()) return make_error(ErrorCode::kInvalidArgument, "tokenizer.json decoder Replace: " + re.error().message);
    return std::unique_ptr<Decoder>(new ReplaceDecoder(std::move(*re), spec.value("content", std::string())));
  }
  return make_error(ErrorCode::kUnsupported, "tokenizer.json decoder type '" + type + "' is not supported");
}

// The decoder the transformers 5 LlamaTokenizer installs: ▁ -> space, byte fallback, fuse,
// strip one leading space.
std::unique_ptr<Decoder> make_llama_decoder() {
  auto spec = json::parse(R"({"type":"Sequence","decoders":[
      {"type":"Replace","pattern":{"String":"\u2581"},"content":" "},{"type":"ByteFallback"},
      {"type":"Fuse"},{"type":"Strip","content":" ","start":1,"stop":0}]})");
  auto decoder = parse_decoder(spec);
  return std::move(decoder.value());
}

}  // namespace strata::tokenizer
