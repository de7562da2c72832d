// Pooling config of an embedding checkpoint in the sentence-transformers layout: modules.json
// (Transformer -> Pooling -> Normalize), the Pooling module's config and the named instruction
// prompts of config_sentence_transformers.json.
#pragma once

#include <map>
#include <string>

#include "core/status.h"

namespace strata {

struct PoolingConfig {
  bool present = false;        // the directory has a modules.json with a Pooling module
  bool normalize = false;      // a Normalize module follows the pooling (L2, unit vectors)
  int32_t dimension = 0;       // word_embedding_dimension (0: not given)
  std::map<std::string, std::string> prompts;  // prompt name -> text prepended to the input
  std::string default_prompt_name;             // empty: none
};

// Reads DIR/modules.json and what it names. No modules.json: present false. A pooling mode
// other than last-token (mean, cls, max, weighted mean) is kUnsupported naming the file and
// the mode; malformed files are kInvalidArgument naming the file and the field.
Result<PoolingConfig> load_pooling_config(const std::string& dir);

}  // namespace strata
