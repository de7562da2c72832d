#include "sampling/grammar/grammar.h"

#include <nlohmann/json.hpp>

#include "sampling/grammar/regex.h"

namespace strata::grammar {

const char* grammar_kind_name(GrammarKind kind) {
  switch (kind) {
    case GrammarKind::kJsonSchema: return "json_schema";
    case GrammarKind::kJsonObject: return "json_object";
    case GrammarKind::kRegex: return "regex";
    case GrammarKind::kChoice: return "choice";
    case GrammarKind::kEbnf: return "ebnf";
  }
  return "?";
}

Result<std::shared_ptr<const Grammar>> compile_regex(std::string_view pattern, const Limits& limits) {
  GrammarBuilder b(limits);
  auto e = regex_to_expr(b, pattern, RegexMode{});
  if (!e.ok()) return e.error();
  const RuleId r = b.add_rule("root");
  b.set_rule(r, *e);
  auto g = b.build(r);
  if (!g.ok() && g.error().message.find("matches no string") != std::string::npos)
    return make_error(ErrorCode::kInvalidArgument, "regex: '" + std::string(pattern) + "' matches no string");
  return g;
}

Result<std::shared_ptr<const Grammar>> compile_choice(const std::vector<std::string>& choices, const Limits& limits) {
  if (choices.empty()) return make_error(ErrorCode::kInvalidArgument, "choice: the list is empty");
  GrammarBuilder b(limits);
  std::vector<ExprId> alts;
  for (const auto& c : choices) {
    if (c.empty()) return make_error(ErrorCode::kInvalidArgument, "choice: an empty string is not a choice");
    alts.push_back(b.literal(c));
  }
  const RuleId r = b.add_rule("root");
  b.set_rule(r, b.alt(std::move(alts)));
  return b.build(r);
}

Result<std::shared_ptr<const Grammar>> compile(const GrammarSpec& spec, const Limits& limits) {
  switch (spec.kind) {
    case GrammarKind::kJsonSchema: return compile_json_schema(spec.text, spec.json, limits);
    case GrammarKind::kJsonObject: return compile_json_object(spec.json.whitespace, limits);
    case GrammarKind::kRegex: return compile_regex(spec.text, limits);
    case GrammarKind::kEbnf: return compile_ebnf(spec.text, limits);
    case GrammarKind::kChoice: {
      std::vector<std::string> choices;
      try {
        const auto j = nlohmann::json::parse(spec.text);
        if (!j.is_array()) return make_error(ErrorCode::kInvalidArgument, "choice: must be a JSON array of strings");
        for (const auto& c : j) {
          if (!c.is_string()) return make_error(ErrorCode::kInvalidArgument, "choice: " + c.dump() + " is not a string");
          choices.push_back(c.get<std::string>());
        }
      } catch (const nlohmann::json::exception& e) {
        return make_error(ErrorCode::kInvalidArgument, std::string("choice: invalid JSON: ") + e.what());
      }
      return compile_choice(choices, limits);
    }
  }
  return make_error(ErrorCode::kInvalidArgument, "grammar: unknown kind");
}

GrammarCache::GrammarCache(size_t capacity, Limits limits) : capacity_(std::max<size_t>(1, capacity)), limits_(limits) {}

std::string GrammarCache::key_of(const GrammarSpec& spec) {
  std::string k = grammar_kind_name(spec.kind);
  if (spec.kind == GrammarKind::kJsonSchema || spec.kind == GrammarKind::kJsonObject) {
    k += spec.json.strict ? "|strict" : "|lax";
    k += spec.json.whitespace == JsonWhitespace::kCompact ? "|compact" : "|flexible";
    k += "|prefix=" + std::to_string(spec.json.prefix.size()) + ":" + spec.json.prefix;
    k += "|suffix=" + std::to_string(spec.json.suffix.size()) + ":" + spec.json.suffix;
  }
  k += '|';
  k += spec.text;
  return k;
}

std::list<GrammarCache::Entry>::iterator GrammarCache::find_or_compile(const GrammarSpec& spec,
                                                                       std::unique_lock<std::mutex>& lock) {
  const std::string key = key_of(spec);
  auto it = index_.find(key);
  if (it != index_.end()) {
    ++hits_;
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second;
  }
  ++misses_;
  lock.unlock();
  auto g = compile(spec, limits_);
  lock.lock();
  it = index_.find(key);  // another thread may have compiled it meanwhile
  if (it != index_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second);
    return it->second;
  }
  lru_.push_front(Entry{key, std::move(g), {}});
  index_[key] = lru_.begin();
  while (lru_.size() > capacity_) {
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
  return lru_.begin();
}

Result<std::shared_ptr<const Grammar>> GrammarCache::get(const GrammarSpec& spec) {
  std::unique_lock<std::mutex> lock(mu_);
  return find_or_compile(spec, lock)->grammar;
}

Result<std::shared_ptr<const TokenMaskCache>> GrammarCache::get_masks(const GrammarSpec& spec,
                                                                      const std::shared_ptr<const Vocabulary>& vocab) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = find_or_compile(spec, lock);
  if (!it->grammar.ok()) return it->grammar.error();
  for (auto& [v, m] : it->masks)
    if (v == vocab.get()) return m;
  auto m = std::make_shared<const TokenMaskCache>(*it->grammar, vocab);
  it->masks.emplace_back(vocab.get(), m);
  return std::shared_ptr<const TokenMaskCache>(m);
}

size_t GrammarCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}
uint64_t GrammarCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}
uint64_t GrammarCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

}  // namespace strata::grammar
