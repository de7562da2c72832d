// The value grammars of the tool-call formats whose arguments are not JSON, shared by the
// whole-text parser (tool_parser.cpp) and the streamer (tool_stream.cpp):
//   Qwen3-Coder / Qwen3.5 XML: a parameter's value is text, typed by the tool's declared schema
//   Gemma 4: {key:VALUE,...} with strings between <|"|> quote tokens and bare keys
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "server/tool_parser.h"

namespace strata::server {

// A step of reading a prefix of model text: done, cannot be this shape, or the text ends first.
enum class Scan { kDone, kBad, kMore };

// The declared type of `param` of tool `tool` ("" when either is not declared).
std::string declared_param_type(const ToolParamTypes* types, const std::string& tool, const std::string& param);

// A Qwen3-Coder parameter's text as the JSON value its declared type asks for: a string type
// (or an undeclared parameter) keeps the text; numbers, booleans, objects and arrays are parsed
// and fall back to the text when it does not parse as one.
nlohmann::ordered_json xml_param_value(std::string_view raw, const std::string& type);

// Whether a parameter of this declared type keeps its text as a JSON string.
bool xml_type_is_text(const std::string& type);

// JSON text of a value the model wrote; bytes that are not UTF-8 become U+FFFD instead of throwing.
std::string dump_json(const nlohmann::ordered_json& v);

// The text between <parameter=K> and </parameter> as the template writes it (a newline after
// the tag and before the close): those two newlines dropped.
std::string_view xml_param_text(std::string_view raw);

// The markers of the tool-call formats, shared by the whole-text parser and the streamer.
constexpr std::string_view kHermesOpen = "<tool_call>";
constexpr std::string_view kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kXmlFunction = "<function=";
constexpr std::string_view kXmlFunctionEnd = "</function>";
constexpr std::string_view kXmlParam = "<parameter=";
constexpr std::string_view kXmlParamEnd = "</parameter>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
constexpr std::string_view kGemmaCall = "<|tool_call>";
constexpr std::string_view kGemmaCallEnd = "<tool_call|>";
constexpr std::string_view kGemmaCallPrefix = "call:";
constexpr std::string_view kGemmaResponse = "<|tool_response>";
constexpr std::string_view kGemmaTurnEnd = "<turn|>";
constexpr std::string_view kGemmaQuote = "<|\"|>";

// A Gemma 4 value at t[*p] (leading whitespace skipped); *p ends after it.
Scan gemma4_value(std::string_view t, size_t* p, nlohmann::ordered_json* out, int depth = 0);
// A Gemma 4 object key and its ':' at t[*p]: bare or between quote tokens.
Scan gemma4_key(std::string_view t, size_t* p, std::string* out);

}  // namespace strata::server
