// --speculative, --num-draft-tokens and --draft-model on serve and generate: the flags, and
// the engine's SpeculativeOptions from them (the draft model loaded, its tokenizer checked
// against the target's).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "core/status.h"
#include "core/thread_pool.h"
#include "engine/speculative.h"

namespace strata::cli {

struct SpeculativeArgs {
  std::string method = "off";
  int32_t num_draft_tokens = 4;
  std::string draft_model;
};

void add_speculative_flags(CLI::App* cmd, SpeculativeArgs& a);

// Refuses, naming the flag and value: an unknown method, --num-draft-tokens outside [1, 16],
// --draft-model without --speculative draft (or the reverse), and a draft whose tokenizer
// differs from the target's (target_dir's). The engine checks the rest (vocabulary, context).
// With load false the draft model is not loaded (a supervisor checks the flags before its
// engine process starts).
Result<SpeculativeOptions> make_speculative_options(const SpeculativeArgs& a, const std::string& target_dir, ThreadPool& pool,
                                                    bool load = true);

}  // namespace strata::cli
