// The chat-template side of the Qwen3-Coder, Mistral and Gemma 4 tool-call formats: an assistant
// turn with tool calls and the tool's result, mapped from an OpenAI request and rendered by
// excerpts of each family's published template (tests/data/chat_templates/, sources in their
// headers), writes the text the hand-written expectation says, and the parser reads the calls back.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "server/api_request.h"
#include "server/request_mapping.h"
#include "server/tool_parser.h"

namespace strata::server {
namespace {

using json = nlohmann::json;

const json kTools = json::parse(R"([{"type": "function", "function": {"name": "get_weather", "parameters": {
  "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
  "metric": {"type": "boolean"}, "hours": {"type": "array"}}}}}])");
const json kArgs = {{"city", "Paris"}, {"days", 3}, {"metric", true}, {"hours", {9, 12}}};

// A user asks, the assistant calls get_weather, the tool answers.
json conversation() {
  return {{"messages",
           {{{"role", "user"}, {"content", "Weather in Paris?"}},
            {{"role", "assistant"}, {"content", nullptr},
             {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                              {"function", {{"name", "get_weather"}, {"arguments", kArgs.dump()}}}}}}},
            {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "sunny"}}}},
          {"tools", kTools}};
}

std::string render_with(const std::string& template_file, ToolCallFormat format) {
  ModelConfig cfg;
  cfg.vocab_size = 4096;
  auto m = load_served_model(std::string(STRATA_SOURCE_DIR) + "/models/strata-demo", "m", cfg, 4096);
  EXPECT_TRUE(m.ok());
  std::ifstream in(std::string(STRATA_TEST_DATA) + "/chat_templates/" + template_file);
  std::stringstream src;
  src << in.rdbuf();
  EXPECT_EQ(detect_tool_call_format(src.str()), format) << template_file;
  auto t = tokenizer::ChatTemplate::parse(src.str());
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.error().message);
  if (!m.ok() || !t.ok()) return "";
  m->chat_template = std::move(t).value();
  m->tool_format = format;  // as load_served_model detects it
  m->template_renders_tools = true;
  ApiRequest r;
  EXPECT_FALSE(parse_chat_request(conversation(), ParseLimits{}, &r));
  std::string text;
  auto e = render_chat_prompt(r, *m, &text);
  EXPECT_FALSE(e) << (e ? e->message : "");
  return text;
}

std::string between(const std::string& text, const std::string& open, const std::string& close) {
  const size_t a = text.find(open);
  if (a == std::string::npos) return "";
  const size_t b = text.find(close, a + open.size());
  return text.substr(a + open.size(), b == std::string::npos ? std::string::npos : b - a - open.size());
}

TEST(ToolTemplates, Qwen3CoderTurnParsesBackWithItsTypes) {
  const std::string text = render_with("qwen3_coder_excerpt.jinja", ToolCallFormat::kQwen3Coder);
  const std::string turn = between(text, "<|im_start|>assistant", "<|im_end|>");
  // Python's `| string` of a boolean, as the template writes it: the schema makes it true again.
  EXPECT_EQ(turn,
            "\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
            "<parameter=hours>\n[9, 12]\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n</function>\n</tool_call>");
  EXPECT_NE(text.find("<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<|im_end|>\n<|im_start|>assistant\n"),
            std::string::npos)
      << text;
  const ToolParamTypes types = tool_param_types(nlohmann::ordered_json::parse(kTools.dump()));
  const ToolParse p = parse_tool_calls(ToolCallFormat::kQwen3Coder, turn, &types);
  ASSERT_EQ(p.calls.size(), 1u) << turn;
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(p.calls[0].arguments), kArgs) << turn;
}

TEST(ToolTemplates, MistralTurnParsesBack) {
  const std::string text = render_with("mistral_excerpt.jinja", ToolCallFormat::kMistral);
  EXPECT_NE(text.find("[INST]Weather in Paris?[/INST][TOOL_CALLS]get_weather[ARGS]{"), std::string::npos) << text;
  EXPECT_NE(text.find("[TOOL_RESULTS]sunny[/TOOL_RESULTS]"), std::string::npos) << text;
  const std::string turn = between(text, "[/INST]", "[TOOL_RESULTS]");
  const ToolParse p = parse_tool_calls(ToolCallFormat::kMistral, turn);
  ASSERT_EQ(p.calls.size(), 1u) << turn;
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(p.calls[0].arguments), kArgs) << turn;
}

// Mistral-7B-Instruct-v0.3's template raises unless every call id has 9 letters and digits;
// the id the client sent ("call_1") is mapped to 9 base-62 digits, the same in the call and in
// the result naming it.
TEST(ToolTemplates, MistralV3TemplateGetsNineCharacterIds) {
  const std::string text = render_with("mistral_v3_excerpt.jinja", ToolCallFormat::kMistral);
  const std::string id = between(text, "\"id\": \"", "\"");
  ASSERT_EQ(id.size(), 9u) << text;
  EXPECT_NE(text.find("[INST] Weather in Paris?[/INST][TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {"), std::string::npos)
      << text;
  EXPECT_NE(text.find("[TOOL_RESULTS] {\"content\": sunny, \"call_id\": \"" + id + "\"}[/TOOL_RESULTS]"), std::string::npos) << text;
  EXPECT_EQ(render_with("mistral_v3_excerpt.jinja", ToolCallFormat::kMistral), text) << "the same id every time";
  const ToolParse p = parse_tool_calls(ToolCallFormat::kMistral, between(text, "[/INST]", "[TOOL_RESULTS]"));
  ASSERT_EQ(p.calls.size(), 1u) << text;
  EXPECT_EQ(json::parse(p.calls[0].arguments), kArgs);
}

TEST(ToolTemplates, Gemma4TurnIsWhatTheTemplateWrites) {
  const std::string text = render_with("gemma4_excerpt.jinja", ToolCallFormat::kGemma4);
  // Keys in dictsort order, bare; the tool's string result as {value:...}, named through the call id.
  const std::string want =
      "<|turn>model\n<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:3,hours:[9,12],metric:true}<tool_call|>"
      "<|tool_response>response:get_weather{value:<|\"|>sunny<|\"|>}<tool_response|>";
  EXPECT_NE(text.find(want), std::string::npos) << text;
  const ToolParse p = parse_tool_calls(ToolCallFormat::kGemma4, between(text, "<|turn>model\n", "<|tool_response>"));
  ASSERT_EQ(p.calls.size(), 1u) << text;
  EXPECT_EQ(p.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(p.calls[0].arguments), kArgs);
}

}  // namespace
}  // namespace strata::server
