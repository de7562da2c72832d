// Tool calls in a model's output text, one parser per output format:
//   kHermes   Qwen 2.5/3, Hermes, many fine-tunes: <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>
//   kLlama3   Llama 3.1+ JSON: {"name": ..., "parameters": {...}} (optionally after <|python_tag|>,
//             several separated by ';'), the whole output being the call
//   kDeepSeek DeepSeek V3 / R1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
//             ```json ARGS ```<｜tool▁call▁end｜>...; V3.1 writes NAME<｜tool▁sep｜>ARGS
//   kQwen3Coder Qwen3-Coder, Qwen3.5: <tool_call>\n<function=NAME>\n<parameter=K>\nVALUE\n</parameter>\n
//             </function>\n</tool_call>; values are text, typed by the tool's parameter schema
//   kMistral  [TOOL_CALLS][{"name": ..., "arguments": {...}}, ...] (before the 2025 templates),
//             [TOOL_CALLS]NAME[ARGS]{...} (and NAME[CALL_ID]ID[ARGS]{...}), once per call
//   kGemma4   <|tool_call>call:NAME{key:<|"|>text<|"|>,n:42,flag:true}<tool_call|>
// Output that does not parse as calls stays content, unchanged. ToolCallFilter does the same
// over streamed text: content before a call streams through, the call itself is held back and
// parsed when the generation ends (ToolCallStreamer, tool_stream.h, streams it as deltas).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata::server {

enum class ToolCallFormat { kNone, kHermes, kLlama3, kDeepSeek, kQwen3Coder, kMistral, kGemma4 };

// "hermes", "llama3", "deepseek", "qwen3_coder", "mistral", "gemma4", "none" (and the names
// other servers give them: "qwen", "llama3_json", "deepseek_v3", "qwen3_xml"); false otherwise.
bool parse_tool_call_format(const std::string& name, ToolCallFormat* out);
const char* tool_call_format_name(ToolCallFormat f);
// The format a chat template writes calls in (kNone when it shows none).
ToolCallFormat detect_tool_call_format(std::string_view chat_template);

// The declared JSON-schema type of each parameter, by tool name then parameter name ("string",
// "integer", ...; "" when undeclared): how kQwen3Coder's text values become JSON.
using ToolParamTypes = std::map<std::string, std::map<std::string, std::string>>;
// From a request's tools ([{type: function, function: {name, parameters}}] or {name, parameters}).
ToolParamTypes tool_param_types(const nlohmann::ordered_json& tools);

// Whether the format writes its markers as special tokens, which decoding must keep.
bool tool_markers_are_special(ToolCallFormat f);

struct ToolCall {
  std::string name;
  std::string arguments;  // a JSON object, as text
};

struct ToolParse {
  std::string content;          // the text that is not a call
  std::vector<ToolCall> calls;  // empty: no (valid) call
};

ToolParse parse_tool_calls(ToolCallFormat format, std::string_view text, const ToolParamTypes* types = nullptr);

class ToolCallFilter {
 public:
  explicit ToolCallFilter(ToolCallFormat format, std::shared_ptr<const ToolParamTypes> types = nullptr)
      : format_(format), types_(std::move(types)) {}
  // Content that is safe to stream now.
  std::string push(std::string_view text);
  // The end: held-back content and the parsed calls.
  ToolParse finish();
  // The call text held back so far (from the first call marker on); empty before a call.
  std::string_view captured() const { return capturing_ ? std::string_view(held_) : std::string_view(); }

 private:
  ToolCallFormat format_;
  std::shared_ptr<const ToolParamTypes> types_;
  std::string held_;
  bool capturing_ = false;
  bool passed_any_ = false;  // kLlama3: content started, so no call can follow
};

}  // namespace strata::server
