// Stop strings, reasoning split and tool-call parsing over the output formats of each family,
// fed whole and in every two-piece split (streaming must give what one piece gives).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/reasoning_parser.h"
#include "server/stop_matcher.h"
#include "server/tool_parser.h"

namespace strata::server {
namespace {

std::string run_stop(const std::vector<std::string>& stops, const std::vector<std::string>& pieces, bool* stopped) {
  StopMatcher m(stops);
  std::string out;
  for (const auto& p : pieces) out += m.push(p);
  out += m.flush();
  *stopped = m.stopped();
  return out;
}

TEST(StopMatcher, CutsAtTheFirstStopInEverySplit) {
  const std::string text = "Hello world. The END is near END";
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      bool stopped = false;
      const std::string out = run_stop({"END", "xyz"}, {text.substr(0, i), text.substr(i, j - i), text.substr(j)}, &stopped);
      ASSERT_TRUE(stopped);
      ASSERT_EQ(out, "Hello world. The ") << i << "," << j;
    }
  }
}

TEST(StopMatcher, NeverEmitsAPartialStop) {
  StopMatcher m({"</answer>"});
  EXPECT_EQ(m.push("abc</an"), "abc");
  EXPECT_EQ(m.push("swer"), "");
  EXPECT_EQ(m.push("!"), "</answer!");  // not the stop after all: released whole
  EXPECT_EQ(m.push("</answer> tail"), "");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</answer>");
}

TEST(StopMatcher, FlushReleasesAHeldPrefixWhenNoStopCame) {
  bool stopped = true;
  EXPECT_EQ(run_stop({"STOP"}, {"abc ST"}, &stopped), "abc ST");
  EXPECT_FALSE(stopped);
  EXPECT_EQ(run_stop({}, {"a", "b"}, &stopped), "ab");
}

TEST(StopMatcher, EarliestStopWinsAcrossStrings) {
  bool stopped = false;
  EXPECT_EQ(run_stop({"world", "lo w"}, {"hello world"}, &stopped), "hel");
}

ReasoningDelta split_all(const std::string& text, size_t cut, bool inside = false) {
  ReasoningSplitter s(inside);
  ReasoningDelta a = s.push(text.substr(0, cut));
  ReasoningDelta b = s.push(text.substr(cut));
  ReasoningDelta c = s.finish();
  return {a.reasoning + b.reasoning + c.reasoning, a.content + b.content + c.content};
}

TEST(ReasoningSplitter, Qwen3ThinkingOutputInEverySplit) {
  const std::string text = "<think>\nThe user greets me. I should answer.\n</think>\n\nHello! How can I help?";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const ReasoningDelta d = split_all(text, cut);
    ASSERT_EQ(d.reasoning, "The user greets me. I should answer.") << cut;
    ASSERT_EQ(d.content, "Hello! How can I help?") << cut;
  }
}

TEST(ReasoningSplitter, DeepSeekR1PromptOpensTheTag) {
  EXPECT_TRUE(prompt_opens_reasoning("<｜User｜>hi<｜Assistant｜><think>\n"));
  EXPECT_FALSE(prompt_opens_reasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  const std::string text = "Okay, let me think.\n</think>\n\nThe answer is 4.";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const ReasoningDelta d = split_all(text, cut, true);
    ASSERT_EQ(d.reasoning, "Okay, let me think.") << cut;
    ASSERT_EQ(d.content, "The answer is 4.") << cut;
  }
}

TEST(ReasoningSplitter, OutputWithoutTagsIsContentUnchanged) {
  const std::string text = "  plain <thin answer";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    const ReasoningDelta d = split_all(text, cut);
    ASSERT_EQ(d.reasoning, "");
    ASSERT_EQ(d.content, text) << cut;
  }
}

TEST(ReasoningSplitter, UnclosedReasoningStaysReasoning) {
  const ReasoningDelta d = split_all("<think>still thinking when the tokens ran out", 9);
  EXPECT_EQ(d.reasoning, "still thinking when the tokens ran out");
  EXPECT_EQ(d.content, "");
}

void expect_call(const ToolCall& c, const std::string& name, const nlohmann::json& args) {
  EXPECT_EQ(c.name, name);
  EXPECT_EQ(nlohmann::json::parse(c.arguments), args);
}

TEST(ToolParser, HermesQwenFormat) {
  const std::string text =
      "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}}\n</tool_call>";
  const ToolParse p = parse_tool_calls(ToolCallFormat::kHermes, text);
  ASSERT_EQ(p.calls.size(), 2u);
  expect_call(p.calls[0], "get_weather", {{"city", "Paris"}, {"unit", "celsius"}});
  expect_call(p.calls[1], "get_time", {{"tz", "CET"}});
  EXPECT_EQ(p.content, "Let me check.");
}

TEST(ToolParser, HermesInvalidJsonStaysContent) {
  const std::string text = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": }\n</tool_call>";
  const ToolParse p = parse_tool_calls(ToolCallFormat::kHermes, text);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, text);
}

TEST(ToolParser, Llama3JsonFormat) {
  ToolParse p = parse_tool_calls(ToolCallFormat::kLlama3, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}");
  ASSERT_EQ(p.calls.size(), 1u);
  expect_call(p.calls[0], "get_weather", {{"city", "Paris"}});
  EXPECT_EQ(p.content, "");
  p = parse_tool_calls(ToolCallFormat::kLlama3,
                       "<|python_tag|>{\"name\": \"a\", \"parameters\": {\"x\": \"}{\"}}; {\"name\": \"b\", \"parameters\": {}}");
  ASSERT_EQ(p.calls.size(), 2u);
  expect_call(p.calls[0], "a", {{"x", "}{"}});
  expect_call(p.calls[1], "b", nlohmann::json::object());
  p = parse_tool_calls(ToolCallFormat::kLlama3, "The weather is {\"name\": \"x\"}");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "The weather is {\"name\": \"x\"}");
}

TEST(ToolParser, DeepSeekV3AndV31Formats) {
  const std::string v3 =
      "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```"
      "<｜tool▁call▁end｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  ToolParse p = parse_tool_calls(ToolCallFormat::kDeepSeek, v3);
  ASSERT_EQ(p.calls.size(), 2u);
  expect_call(p.calls[0], "get_weather", {{"city", "Paris"}});
  expect_call(p.calls[1], "get_time", nlohmann::json::object());
  const std::string v31 =
      "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Rome\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
  p = parse_tool_calls(ToolCallFormat::kDeepSeek, v31);
  ASSERT_EQ(p.calls.size(), 1u);
  expect_call(p.calls[0], "get_weather", {{"city", "Rome"}});
  EXPECT_EQ(p.content, "Sure.");
}

// Tools as a request declares them; Qwen3-Coder's values take their JSON types from here.
const nlohmann::ordered_json kWeatherTools = nlohmann::ordered_json::parse(R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
    "hours": {"type": "array", "items": {"type": "number"}}, "where": {"type": "object"},
    "zip": {"type": ["string", "null"]}, "scale": {"type": "number"}}}}},
  {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}
])");

// As Qwen/Qwen3-Coder-30B-A3B-Instruct's chat_template.jinja (Hugging Face) renders an assistant
// turn: '\n<tool_call>\n<function=' + name + '>\n', per argument '<parameter=' + k + '>\n' +
// value + '\n</parameter>\n', then '</function>\n</tool_call>'; values that are not mappings or
// lists go through `| string`, so a boolean reads True. Qwen3.5's template writes the same body.
TEST(ToolParser, Qwen3CoderXmlTypedBySchema) {
  const std::string text =
      "I'll look that up.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=hours>\n[9, 12.5]\n"
      "</parameter>\n<parameter=where>\n{\"lat\": 40.7, \"lon\": -74.0}\n</parameter>\n<parameter=zip>\n10001\n</parameter>\n"
      "<parameter=note>\nline one\nline two\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
      "</function>\n</tool_call>";
  const ToolParamTypes types = tool_param_types(kWeatherTools);
  ToolParse p = parse_tool_calls(ToolCallFormat::kQwen3Coder, text, &types);
  ASSERT_EQ(p.calls.size(), 2u);
  // A string type stays text even when it reads as a number; an undeclared parameter is text.
  expect_call(p.calls[0], "get_weather",
              {{"city", "New York"}, {"days", 3}, {"metric", true}, {"hours", {9, 12.5}},
               {"where", {{"lat", 40.7}, {"lon", -74.0}}}, {"zip", "10001"}, {"note", "line one\nline two"}});
  EXPECT_EQ(p.calls[0].arguments.substr(0, 28), "{\"city\":\"New York\",\"days\":3,") << "the order the model wrote";
  expect_call(p.calls[1], "get_time", nlohmann::json::object());
  EXPECT_EQ(p.content, "I'll look that up.");
  // Without the schema every value is text; a value that does not parse as its type stays text.
  p = parse_tool_calls(ToolCallFormat::kQwen3Coder, text);
  expect_call(p.calls[0], "get_weather",
              {{"city", "New York"}, {"days", "3"}, {"metric", "True"}, {"hours", "[9, 12.5]"},
               {"where", "{\"lat\": 40.7, \"lon\": -74.0}"}, {"zip", "10001"}, {"note", "line one\nline two"}});
  p = parse_tool_calls(ToolCallFormat::kQwen3Coder,
                       "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=scale>\n"
                       "null\n</parameter>\n</function>\n</tool_call>",
                       &types);
  ASSERT_EQ(p.calls.size(), 1u);
  expect_call(p.calls[0], "get_weather", {{"days", "three"}, {"scale", nullptr}});
}

TEST(ToolParser, Qwen3CoderLenientAndInvalidShapes) {
  // A parameter left open ends at the next one; a bare <function=...> without <tool_call> is a call.
  ToolParse p = parse_tool_calls(ToolCallFormat::kQwen3Coder,
                                 "<function=f>\n<parameter=a>\nx\n<parameter=b>\ny\n</parameter>\n</function>");
  ASSERT_EQ(p.calls.size(), 1u);
  expect_call(p.calls[0], "f", {{"a", "x"}, {"b", "y"}});
  // The JSON body of the earlier Qwen models inside <tool_call> still reads as a call.
  p = parse_tool_calls(ToolCallFormat::kQwen3Coder, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>");
  ASSERT_EQ(p.calls.size(), 1u);
  expect_call(p.calls[0], "f", {{"a", 1}});
  // No name: not a call, the text stays content.
  const std::string bad = "<tool_call>\n<function=>\n</function>\n</tool_call>";
  p = parse_tool_calls(ToolCallFormat::kQwen3Coder, bad);
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, bad);
}

// Mistral-7B-Instruct-v0.3's chat template (mistralai/Mistral-7B-Instruct-v0.3,
// tokenizer_config.json) writes "[TOOL_CALLS] [" + each call's function|tojson without its last
// brace + ', "id": "' + id + '"}' + "]"; the 2025 templates (chat_template.jinja of Ministral 3 and
// Devstral Small 2) write '[TOOL_CALLS]' + name + '[ARGS]' + arguments|tojson once per call, and
// the mid-2025 ones name + '[CALL_ID]' + id + '[ARGS]' + arguments.
TEST(ToolParser, MistralListAndArgsForms) {
  ToolParse p = parse_tool_calls(ToolCallFormat::kMistral,
                                 "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}, "
                                 "{\"name\": \"get_time\", \"arguments\": {}, \"id\": \"xyz987uvw\"}]");
  ASSERT_EQ(p.calls.size(), 2u);
  expect_call(p.calls[0], "get_weather", {{"city", "Paris"}});
  expect_call(p.calls[1], "get_time", nlohmann::json::object());
  EXPECT_EQ(p.content, "");
  p = parse_tool_calls(ToolCallFormat::kMistral,
                       "Let me check.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": [1, 2]}"
                       "[TOOL_CALLS]get_time[ARGS]{}");
  ASSERT_EQ(p.calls.size(), 2u);
  expect_call(p.calls[0], "get_weather", {{"city", "Paris"}, {"days", {1, 2}}});
  expect_call(p.calls[1], "get_time", nlohmann::json::object());
  EXPECT_EQ(p.content, "Let me check.");
  p = parse_tool_calls(ToolCallFormat::kMistral, "[TOOL_CALLS]get_weather[CALL_ID]abc123def[ARGS]{\"city\": \"Rome\"}");
  ASSERT_EQ(p.calls.size(), 1u);
  expect_call(p.calls[0], "get_weather", {{"city", "Rome"}});
  for (const std::string bad : {"[TOOL_CALLS]get_weather[ARGS]{\"city\": ", "[TOOL_CALLS] [{\"arguments\": {}}]",
                                "[TOOL_CALLS][ARGS]{}"}) {
    p = parse_tool_calls(ToolCallFormat::kMistral, bad);
    EXPECT_TRUE(p.calls.empty()) << bad;
    EXPECT_EQ(p.content, bad);
  }
}

// Gemma 4's chat template (google/gemma-4-E4B-it, chat_template.jinja) writes each call as
// '<|tool_call>call:' + name + '{' + for key in arguments|dictsort: key + ':' +
// format_argument(value, escape_keys=False) + '}<tool_call|>': strings between <|"|> tokens,
// booleans true/false, numbers bare, mappings {k:v} with bare keys, lists [a,b]; calls follow one
// another with no separator, and the model then opens <|tool_response>.
TEST(ToolParser, Gemma4CallFormat) {
  const std::string text =
      "Checking both.<|tool_call>call:get_weather{city:<|\"|>Paris, \"the\" city {of light}<|\"|>,days:3,"
      "hours:[9,12.5],metric:true,where:{lat:48.85,name:<|\"|>centre<|\"|>},zip:null}<tool_call|>"
      "<|tool_call>call:get_time{}<tool_call|><|tool_response>";
  ToolParse p = parse_tool_calls(ToolCallFormat::kGemma4, text);
  ASSERT_EQ(p.calls.size(), 2u);
  expect_call(p.calls[0], "get_weather",
              {{"city", "Paris, \"the\" city {of light}"}, {"days", 3}, {"hours", {9, 12.5}}, {"metric", true},
               {"where", {{"lat", 48.85}, {"name", "centre"}}}, {"zip", nullptr}});
  expect_call(p.calls[1], "get_time", nlohmann::json::object());
  EXPECT_EQ(p.content, "Checking both.");
  for (const std::string bad : {"<|tool_call>call:f{a:<|\"|>open}<tool_call|>", "<|tool_call>f{a:1}<tool_call|>",
                                "<|tool_call>call:{a:1}<tool_call|>"}) {
    p = parse_tool_calls(ToolCallFormat::kGemma4, bad);
    EXPECT_TRUE(p.calls.empty()) << bad;
    EXPECT_EQ(p.content, bad);
  }
}

TEST(ToolParser, DetectsTheFormatFromTheTemplate) {
  EXPECT_EQ(detect_tool_call_format("{{- '<tool_call>\\n{\"name\": \"' }}"), ToolCallFormat::kHermes);
  EXPECT_EQ(detect_tool_call_format("'<｜tool▁calls▁begin｜>'"), ToolCallFormat::kDeepSeek);
  EXPECT_EQ(detect_tool_call_format("{\"name\": function name, \"parameters\": ...}<|eot_id|>"), ToolCallFormat::kLlama3);
  EXPECT_EQ(detect_tool_call_format("{{ messages }}"), ToolCallFormat::kNone);
  // The lines of each published template that spell its call format (sources as above).
  EXPECT_EQ(detect_tool_call_format("{{- '\\n<tool_call>\\n<function=' + tool_call.name + '>\\n' }}"
                                    "{{- '<parameter=' + args_name + '>\\n' }}{{- '</function>\\n</tool_call>' }}"),
            ToolCallFormat::kQwen3Coder);
  EXPECT_EQ(detect_tool_call_format("{{- '[TOOL_CALLS]' + tool['function']['name'] + '[ARGS]' + arguments }}"),
            ToolCallFormat::kMistral);
  EXPECT_EQ(detect_tool_call_format("{{- \"[TOOL_CALLS] [\" }}{%- set out = tool_call.function|tojson %}"), ToolCallFormat::kMistral);
  EXPECT_EQ(detect_tool_call_format("{{- '<|tool_call>call:' + function['name'] + '{' -}}{{- '}<tool_call|>' -}}"),
            ToolCallFormat::kGemma4);
  for (const char* name : {"qwen3_coder", "mistral", "gemma4"}) {
    ToolCallFormat f = ToolCallFormat::kNone;
    ASSERT_TRUE(parse_tool_call_format(name, &f)) << name;
    EXPECT_STREQ(tool_call_format_name(f), name);
  }
}

// Streaming through the filter gives the same content and calls as parsing the whole text.
void check_filter(ToolCallFormat f, const std::string& text) {
  const ToolParse whole = parse_tool_calls(f, text);
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ToolCallFilter filter(f);
    std::string content = filter.push(text.substr(0, cut));
    content += filter.push(text.substr(cut));
    ToolParse end = filter.finish();
    content += end.content;
    ASSERT_EQ(end.calls.size(), whole.calls.size()) << cut;
    for (size_t i = 0; i < whole.calls.size(); ++i) {
      ASSERT_EQ(end.calls[i].name, whole.calls[i].name);
      ASSERT_EQ(end.calls[i].arguments, whole.calls[i].arguments);
    }
    if (whole.calls.empty()) ASSERT_EQ(content, text) << cut;
  }
}

TEST(ToolCallFilter, StreamingMatchesWholeParsing) {
  check_filter(ToolCallFormat::kHermes, "I will call.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>");
  check_filter(ToolCallFormat::kHermes, "no call here, just <tool text");
  check_filter(ToolCallFormat::kLlama3, "  {\"name\": \"f\", \"parameters\": {\"a\": [1, 2]}}");
  check_filter(ToolCallFormat::kLlama3, "Plain answer {not a call}");
  check_filter(ToolCallFormat::kDeepSeek,
               "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 2}<｜tool▁call▁end｜><｜tool▁calls▁end｜>");
  check_filter(ToolCallFormat::kQwen3Coder, "Sure.\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>");
  check_filter(ToolCallFormat::kQwen3Coder, "a <function without a call");
  check_filter(ToolCallFormat::kMistral, "Sure.[TOOL_CALLS]f[ARGS]{\"a\": 1}");
  check_filter(ToolCallFormat::kMistral, "[TOOL_CALLS] [{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
  check_filter(ToolCallFormat::kMistral, "no [TOOL call here");
  check_filter(ToolCallFormat::kGemma4, "Sure.<|tool_call>call:f{a:<|\"|>x<|\"|>}<tool_call|>");
  check_filter(ToolCallFormat::kGemma4, "plain <|tool text");
}

TEST(ToolCallFilter, ContentBeforeACallStreamsAtOnce) {
  ToolCallFilter f(ToolCallFormat::kHermes);
  EXPECT_EQ(f.push("Checking the weather"), "Checking the weather");
  EXPECT_EQ(f.push(" now <tool"), " now ");
  EXPECT_EQ(f.push("_call>{\"name\": \"w\", \"arguments\": {}}"), "");
  const ToolParse p = f.finish();
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.calls[0].name, "w");
}

}  // namespace
}  // namespace strata::server
