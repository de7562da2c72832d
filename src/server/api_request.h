// ApiRequest: what the three generation endpoints (/v1/chat/completions, /v1/completions,
// /v1/messages) ask for, parsed and validated from the request JSON by pure functions. Unknown
// fields are ignored; a known field with a wrong type or an unsupported value is an ApiError
// naming the field and the value. Nothing here needs the model or the tokenizer: prompt
// length checks and defaults come later (request_mapping.h).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/structured_output.h"

namespace strata::server {

enum class ApiKind { kChat, kCompletion, kMessages, kResponses };

struct ApiRequest {
  ApiKind kind = ApiKind::kChat;
  std::string model;  // as the client named it ("" when absent: the served model)

  // Chat and Messages: OpenAI-style messages ready for a chat template (content is a string,
  // assistant tool_calls carry arguments as objects, tool results carry tool_call_id).
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null, or [{type: function, function: {name, description, parameters}}]
  std::string tool_choice = "auto";  // "none", "auto", "required" or "function"
  std::string tool_choice_name;      // tool_choice "function": the named tool
  std::vector<std::string> strict_tools;  // tools whose function says strict: true
  // The grammar the output must match (structured_output.h); nullopt: free text. A forced
  // tool call (tool_choice required / a function) gets its grammar in prepare_request.
  std::optional<OutputConstraint> constraint;
  nlohmann::ordered_json chat_template_kwargs = nlohmann::ordered_json::object();
  // reasoning_effort (chat) or reasoning.effort (Responses): none, minimal, low, medium, high or
  // xhigh; "" when not given. The template sees it as reasoning_effort (request_mapping.cpp).
  std::string reasoning_effort;

  // Completions: a text prompt or token ids.
  bool prompt_is_ids = false;
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool echo = false;

  // Sampling: unset values fall back to the CLI flags, then generation_config.json.
  std::optional<int32_t> max_tokens;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int32_t> top_k;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;
  std::optional<uint64_t> seed;
  std::vector<std::string> stop;
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool speculative = true;  // false: opt out of the server's speculative decoding
  bool skip_special_tokens = true;
  int32_t logprobs = -1;  // -1: none; else top-N alternatives per token (0..20)
  bool tokens_as_ids = false;  // return_tokens_as_token_ids (vLLM): logprob tokens as "token_id:N"

  // Choices (chat and completions): n returned, best_of generated (completions; 0: n). Choice
  // i samples with seed + i (ChoiceSet in http_server.cpp).
  int32_t n = 1;
  int32_t best_of = 0;

  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int32_t priority = 0;
  std::string session_id;
  std::string user;
};

struct ParseLimits {
  std::vector<std::string> model_names;  // accepted values of "model" (empty: any)
  int max_json_depth = 256;              // JSON texts inside the body (tool-call arguments)
};

inline constexpr int32_t kMaxChoices = 128;  // n and best_of at most

inline constexpr const char* kReasoningEfforts[] = {"none", "minimal", "low", "medium", "high", "xhigh"};
// The effort at o[key] (absent or null: *out untouched), one of kReasoningEfforts; errors name `field`.
std::optional<ApiError> read_reasoning_effort(const nlohmann::json& o, const char* key, const std::string& field,
                                              std::string* out);

// Each fills *out and returns nullopt, or returns the error.
std::optional<ApiError> parse_chat_request(const nlohmann::json& body, const ParseLimits& limits, ApiRequest* out);
std::optional<ApiError> parse_completion_request(const nlohmann::json& body, const ParseLimits& limits, ApiRequest* out);
std::optional<ApiError> parse_messages_request(const nlohmann::json& body, const ParseLimits& limits, ApiRequest* out);

}  // namespace strata::server
