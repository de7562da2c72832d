// The grammar engine's public API for constrained decoding (structured output).
//
//   auto vocab = Vocabulary::create(token_bytes, special_ids, stop_ids);   // once per tokenizer
//   GrammarCache cache;                                                     // once per server
//   auto masks = cache.get_masks({GrammarKind::kJsonSchema, schema_text}, *vocab);
//   Matcher m(*masks);                                                      // per sequence
//   m.fill_next_token_bitmask(words); ... m.accept_token(id); m.rollback(k); m.forced_bytes();
//
// Compiled grammars and their token-mask caches are immutable or internally locked and shared
// between requests; a Matcher belongs to one sequence (one thread at a time).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/status.h"
#include "sampling/grammar/ebnf.h"
#include "sampling/grammar/ir.h"
#include "sampling/grammar/json_schema.h"
#include "sampling/grammar/matcher.h"
#include "sampling/grammar/vocabulary.h"

namespace strata::grammar {

enum class GrammarKind {
  kJsonSchema,  // text: the schema
  kJsonObject,  // text ignored: any JSON object
  kRegex,       // text: an ECMAScript-subset pattern, matched in full
  kChoice,      // text: a JSON array of strings; the output is exactly one of them
  kEbnf,        // text: a GBNF grammar with a `root` rule
};
const char* grammar_kind_name(GrammarKind kind);

struct GrammarSpec {
  GrammarKind kind = GrammarKind::kJsonSchema;
  std::string text;
  JsonSchemaOptions json;  // JSON Schema and json_object
};

// Front ends. Errors name the keyword / construct / rule and the value (kInvalidArgument for
// bad input, kUnsupported for valid input strata does not handle, kResourceExhausted past
// `limits`).
Result<std::shared_ptr<const Grammar>> compile_regex(std::string_view pattern, const Limits& limits = {});
Result<std::shared_ptr<const Grammar>> compile_choice(const std::vector<std::string>& choices, const Limits& limits = {});
Result<std::shared_ptr<const Grammar>> compile(const GrammarSpec& spec, const Limits& limits = {});

// Compiled grammars by (kind, options, text), least recently used first out; and per grammar
// one TokenMaskCache per vocabulary, so requests with the same schema share their masks.
// Errors are cached too: a schema that failed once fails again without recompiling.
// Thread-safe; compilation runs outside the lock.
class GrammarCache {
 public:
  explicit GrammarCache(size_t capacity = 256, Limits limits = {});

  Result<std::shared_ptr<const Grammar>> get(const GrammarSpec& spec);
  Result<std::shared_ptr<const TokenMaskCache>> get_masks(const GrammarSpec& spec,
                                                          const std::shared_ptr<const Vocabulary>& vocab);
  size_t size() const;
  uint64_t hits() const;
  uint64_t misses() const;
  // The cache key of a spec: kind, options and text (names the grammar in checkpoint keys).
  static std::string key_of(const GrammarSpec& spec);

 private:
  struct Entry {
    std::string key;
    Result<std::shared_ptr<const Grammar>> grammar = Error{};
    std::vector<std::pair<const Vocabulary*, std::shared_ptr<const TokenMaskCache>>> masks;
  };
  std::list<Entry>::iterator find_or_compile(const GrammarSpec& spec, std::unique_lock<std::mutex>& lock);

  size_t capacity_;
  Limits limits_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;  // front: most recently used
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace strata::grammar
