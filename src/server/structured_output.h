// Structured output: the constraints a request puts on its output, parsed from the API fields
// (OpenAI response_format; vLLM structured_outputs and the older guided_*), the grammar of a
// forced tool call in the model's own tool-call format (tool_choice required or a named
// function; Anthropic any / tool), and their compilation through the served model's grammar
// cache into what the engine runs. Every refusal names the field.
#pragma once

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/request.h"
#include "sampling/grammar/grammar.h"
#include "server/api_error.h"
#include "server/tool_parser.h"

namespace strata::server {

struct ApiRequest;
struct ServedModel;

struct OutputConstraint {
  grammar::GrammarSpec spec;
  std::string field;  // what asked for it, e.g. "response_format.json_schema.schema"
};

// response_format, structured_outputs and guided_json / guided_regex / guided_choice /
// guided_grammar of a chat or completions body: at most one constraint (two are a 400 naming
// the second). nullopt in *out when the output is free text.
std::optional<ApiError> parse_output_constraint(const nlohmann::json& body, std::optional<OutputConstraint>* out);

// The grammar of one call of the request's tools (tool_choice required: any of them; a named
// function: that one) in `format`: Hermes "<tool_call>\n{"name": ..., "arguments": ...}\n
// </tool_call>", Llama 3 {"name": ..., "parameters": ...}; arguments follow the tool's
// parameters schema (strict when every candidate tool says strict).
std::optional<ApiError> forced_tool_call_constraint(const ApiRequest& request, ToolCallFormat format, OutputConstraint* out);

// Compiles (or finds) the constraint's grammar for the model's vocabulary and sets
// g->grammar / g->grammar_key. Compile errors are 400s naming c.field.
std::optional<ApiError> attach_constraint(const OutputConstraint& c, const ServedModel& model, GenerationRequest* g);

}  // namespace strata::server
