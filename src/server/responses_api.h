// The OpenAI Responses API (POST /v1/responses): the request's input items become chat
// messages for the chat template, and ResponsesBuilder writes the response object and its
// typed stream events (response.created ... response.completed, each with a sequence_number).
// A stored response's conversation (input and output, without instructions, which OpenAI does
// not carry over) is what previous_response_id continues, rendered through the same template,
// so the continued prompt shares the previous one's prefix and hits the prefix cache.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/api_request.h"
#include "server/api_response.h"
#include "server/response_store.h"

namespace strata::server {

struct ResponsesRequest {
  ApiRequest api;  // kind kResponses; messages are set by resolve_previous_response
  std::string previous_response_id;
  bool store = true;
  std::string instructions;            // "" when none
  nlohmann::ordered_json input;        // chat messages from the request's input
  nlohmann::ordered_json conversation; // the previous conversation + input: what is stored
  nlohmann::json echo;                 // request fields the response object repeats
};

// Parses and validates a /v1/responses body; errors name the field and the value.
std::optional<ApiError> parse_responses_request(const nlohmann::json& body, const ParseLimits& limits,
                                                ResponsesRequest* out);

// Puts the instructions and the conversation of previous_response_id before the input
// (404 naming the id when the store does not hold it).
std::optional<ApiError> resolve_previous_response(ResponseStore& store, ResponsesRequest* r);

class ResponsesBuilder : public ResponseBuilder {
 public:
  ResponsesBuilder(ResponseContext context, nlohmann::json echo);

  std::string start() override;
  std::string delta(const OutputDelta& d) override;
  std::string finish(const OutputDelta& last, const std::vector<ToolCall>& calls, const FinishState& f) override;
  nlohmann::json body() const override;
  std::string stream_error(const ApiError& e) const override;

  // The output as one assistant chat message (content, reasoning_content, tool_calls), for the
  // stored conversation.
  nlohmann::ordered_json assistant_message() const;

 private:
  enum class Open { kNone, kMessage, kReasoning };
  nlohmann::json response_json(const std::string& status) const;
  std::string event(const std::string& type, nlohmann::json j) const;
  std::string close_open();
  std::string open_item(Open kind);
  std::string item_id(const std::string& prefix, size_t index) const;

  ResponseContext c_;
  nlohmann::json echo_;
  mutable int64_t seq_ = 0;  // sequence_number of the next event
  nlohmann::json items_ = nlohmann::json::array();  // output items, as they stand
  Open open_ = Open::kNone;
  size_t open_index_ = 0;            // output index of the open message or reasoning item
  std::vector<size_t> call_items_;   // by call index: its output index
  std::string status_ = "in_progress";
  std::string closing_status_ = "completed";  // of a message item closed now: "incomplete" when cut
  nlohmann::json incomplete_ = nullptr;
  nlohmann::json usage_ = nullptr;
};

}  // namespace strata::server
