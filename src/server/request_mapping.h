// From a validated ApiRequest to what the engine runs: the prompt ids (chat template applied
// and tokenized, or the text/ids of a completion), the sampling settings resolved as
// request > CLI flag > generation_config.json > built-in default, max_tokens checked against
// the context, and how the output is to be assembled (stop strings, reasoning, tool calls).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/request.h"
#include "model/model_config.h"
#include "model/pooling.h"
#include "server/api_error.h"
#include "server/api_request.h"
#include "server/output_assembler.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

struct SamplingDefaults {
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  std::optional<int32_t> max_tokens;
};

// generation_config.json's sampling defaults (do_sample false means greedy).
SamplingDefaults generation_defaults(const ModelConfig& config);

// The model as the API layer sees it; built once at startup, read-only afterwards.
struct ServedModel {
  std::string name;  // what /v1/models lists and requests name
  tokenizer::Tokenizer tokenizer;
  std::optional<tokenizer::ChatTemplate> chat_template;
  bool template_renders_tools = false;
  int32_t model_vocab = 0;    // width of the logits
  int32_t max_model_len = 0;  // prompt + generated tokens at most
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  bool reasoning = false;     // the vocabulary has <think> and </think>
  SamplingDefaults generation;  // from generation_config.json
  SamplingDefaults cli;         // from the command line (wins over generation)
  // Constrained decoding: the tokenizer as the grammar engine sees it (stop ids: the engine's
  // EOS ids) and the compile cache every request shares. Null: structured output is refused.
  std::shared_ptr<const grammar::Vocabulary> grammar_vocab;
  std::shared_ptr<grammar::GrammarCache> grammars;
  // Served for embeddings (strata serve --task embed): /v1/embeddings answers, generation
  // endpoints refuse; the pooling config of the checkpoint's sentence-transformers modules.
  bool embedding = false;
  PoolingConfig pooling;
};

// Builds m's grammar vocabulary (token bytes, special ids, `stop_ids`) and compile cache.
Status enable_structured_output(ServedModel& m, const std::vector<int32_t>& stop_ids);

// Loads the tokenizer and chat template of `dir` and derives the tool-call format ("auto":
// from the template) and reasoning support.
Result<ServedModel> load_served_model(const std::string& dir, const std::string& name, const ModelConfig& config,
                                      int32_t max_model_len, const std::string& tool_parser = "auto");

struct PreparedRequest {
  GenerationRequest generation;  // id left empty: the caller names it
  OutputOptions output;
  std::string prompt_text;  // the prompt as text (for echo)
};

// The chat template's output for the request's messages (and tools).
std::optional<ApiError> render_chat_prompt(const ApiRequest& request, const ServedModel& model, std::string* prompt);

std::optional<ApiError> prepare_request(const ApiRequest& request, const ServedModel& model, PreparedRequest* out);

// Sampling settings for a request: request > cli > generation > built-in defaults.
SamplingParams resolve_sampling(const ApiRequest& request, const SamplingDefaults& cli, const SamplingDefaults& generation);

}  // namespace strata::server
