// Post-processors of tokenizer.json, reduced to what they do to the ids of one sequence
// when special tokens are requested: TemplateProcessing (its "single" template),
// BertProcessing / RobertaProcessing ([CLS] A [SEP]), ByteLevel (offsets only: nothing),
// Sequence.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "core/status.h"

namespace strata::tokenizer {

class PostProcessor {
 public:
  // Ids placed before and after the sequence.
  std::vector<int32_t> prefix;
  std::vector<int32_t> suffix;

  void apply(std::vector<int32_t>& ids) const {
    if (!prefix.empty()) ids.insert(ids.begin(), prefix.begin(), prefix.end());
    ids.insert(ids.end(), suffix.begin(), suffix.end());
  }
};

// Reads a tokenizer.json "post_processor" value (null gives one that adds nothing).
Result<PostProcessor> parse_post_processor(const nlohmann::json& spec);

}  // namespace strata::tokenizer
