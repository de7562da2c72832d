// Response builders: one per API (chat completions, completions, Anthropic messages). Each
// takes the assembled output deltas of one request and produces both forms of the answer:
// the SSE text of a streaming response (OpenAI `data: {...}` chunks ending in `data: [DONE]`,
// or Anthropic's typed events) and the JSON body of a non-streaming one. Pure: no I/O.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "server/api_error.h"
#include "server/api_request.h"
#include "server/output_assembler.h"
#include "tokenizer/tokenizer.h"

namespace strata::server {

struct ResponseContext {
  std::string id;      // chatcmpl-..., cmpl-..., msg_...
  std::string model;   // served model name
  int64_t created = 0; // unix seconds
  bool include_usage = false;  // OpenAI streams: a last chunk with usage
  int32_t logprobs = -1;       // -1: none
  bool tokens_as_ids = false;  // logprob tokens as "token_id:N" (return_tokens_as_token_ids)
  bool echo = false;           // completions: the prompt text comes first
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  // n > 1 (chat and completions): one builder per choice, each writing its own index; the
  // choices share one stream, so finish() leaves the usage chunk and [DONE] to stream_end().
  int32_t choice_index = 0;
  bool shared_stream = false;
};

struct FinishState {
  FinishReason reason = FinishReason::kStop;
  bool stop_string = false;   // a stop string ended it (the engine saw a cancel)
  std::string stop_sequence;  // that string
  int32_t stop_token = -1;
  Usage usage;
  std::string error;          // kError: what failed
};

class ResponseBuilder {
 public:
  virtual ~ResponseBuilder() = default;
  // SSE text sent before the first token.
  virtual std::string start() = 0;
  // Prompt logprobs (echo with logprobs), before any delta.
  virtual void prompt_logprobs(const std::vector<TokenLogprobs>&) {}
  // One output delta: accumulated for body(); returns its SSE text ("" when nothing to send).
  virtual std::string delta(const OutputDelta& d) = 0;
  // The last delta and the end; returns the closing SSE text.
  virtual std::string finish(const OutputDelta& last, const std::vector<ToolCall>& calls, const FinishState& f) = 0;
  // The non-streaming answer, valid after finish().
  virtual nlohmann::json body() const = 0;
  // An error after the stream started: an SSE error event (and the stream's end).
  virtual std::string stream_error(const ApiError& e) const = 0;
  // The end of a stream the choices share (shared_stream): the usage chunk over all of them,
  // when asked, and [DONE].
  virtual std::string stream_end(const Usage&) const { return ""; }
  // A field added under usage (the strata trace), set before finish().
  void set_usage_extension(const std::string& key, nlohmann::json value) { usage_ext_[key] = std::move(value); }

 protected:
  nlohmann::json with_usage_extension(nlohmann::json usage) const {
    for (auto it = usage_ext_.begin(); it != usage_ext_.end(); ++it) usage[it.key()] = it.value();
    return usage;
  }
  nlohmann::json usage_ext_ = nlohmann::json::object();
};

std::unique_ptr<ResponseBuilder> make_response_builder(ApiKind kind, ResponseContext context, const tokenizer::Tokenizer& tokenizer);

// OpenAI's finish_reason for an ended request: stop, length, tool_calls, abort, error.
std::string openai_finish_reason(const FinishState& f, bool has_tool_calls);
// Anthropic's stop_reason: end_turn, max_tokens, stop_sequence, tool_use.
std::string anthropic_stop_reason(const FinishState& f, bool has_tool_calls);

// The usage of an answer of several choices: the prompt once (the first choice's prompt and
// cached counts), the completion tokens of every choice generated.
Usage sum_choice_usage(const std::vector<Usage>& choices);
// The non-streaming answer of several choices: the first body with the choices of all bodies,
// in order and numbered 0.., and the usage given.
nlohmann::json merge_choice_bodies(const std::vector<nlohmann::json>& bodies, const Usage& usage);
// best_of: the indices of the n candidates with the highest cumulative logprob (the sum of their
// chosen tokens' logprobs), best first; ties keep the earlier candidate first.
std::vector<size_t> best_candidates(const std::vector<double>& cumulative_logprobs, size_t n);

nlohmann::json usage_json(const Usage& u);
// usage.speculation: {draft_tokens, accepted_tokens}, for requests that ran the speculative method.
nlohmann::json speculation_json(const Usage& u);
// Token fill of a constrained request: {tokens, spans} appended without sampling.
nlohmann::json fill_json(const Usage& u);
std::string sse_data(const nlohmann::json& j);
std::string sse_event(const std::string& name, const nlohmann::json& j);
// A fresh random id: prefix + 24 hex digits.
std::string random_id(const std::string& prefix);

}  // namespace strata::server
