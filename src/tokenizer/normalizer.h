// Normalizers of tokenizer.json: Sequence, Prepend, Replace, NFC/NFD/NFKC/NFKD, Lowercase,
// Strip. Each rewrites a (valid UTF-8) string in place; alignment offsets are not tracked
// because strata needs only ids.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace strata::tokenizer {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// Builds the normalizer a tokenizer.json "normalizer" value describes; null gives nullptr.
// An unknown type is an Error naming it.
Result<std::unique_ptr<Normalizer>> parse_normalizer(const nlohmann::json& spec);

// Unicode normal forms through utf8proc, with an ASCII/Latin fast path.
enum class NormalForm { kNfc, kNfd, kNfkc, kNfkd };
std::string normalize_unicode(const std::string& text, NormalForm form);

// True when NFC leaves `cp` unchanged whatever surrounds it: a starter that is no second
// element of a composition and recomposes to itself. Text made only of such code points
// skips normalization.
bool is_nfc_inert(uint32_t cp);

}  // namespace strata::tokenizer
