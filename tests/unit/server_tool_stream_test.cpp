// Streamed tool calls: ToolCallStreamer over hand-written model text in each format, fed in
// every split, through the OutputAssembler with Qwen3's tokens, as OpenAI chunks and as
// Anthropic tool_use blocks.
#include <gtest/gtest.h>

#include <map>

#include <nlohmann/json.hpp>

#include "server/api_response.h"
#include "server/output_assembler.h"
#include "server/tool_stream.h"
#include "tokenizer_test_util.h"

namespace strata::server {
namespace {

using json = nlohmann::json;

struct Streamed {
  std::vector<std::string> names;      // in the order the calls started
  std::vector<std::string> arguments;  // concatenated pieces, by index
  size_t n_deltas = 0;
  size_t first_args_delta = 0;  // deltas of call 0 before its arguments were complete
};

void add_deltas(const std::vector<ToolCallDelta>& deltas, Streamed* s) {
  for (const auto& d : deltas) {
    ++s->n_deltas;
    if (d.first) {
      ASSERT_EQ(size_t(d.index), s->names.size()) << "a call starts once, in order";
      s->names.push_back(d.name);
      s->arguments.emplace_back();
    }
    ASSERT_LT(size_t(d.index), s->names.size()) << "arguments before the call's name";
    s->arguments[size_t(d.index)] += d.arguments;
  }
}

// Feeds `text` to a filter and a streamer in pieces of `step` bytes, as the assembler does;
// the streamed calls must equal the whole parse.
Streamed stream_text(ToolCallFormat f, const std::string& text, size_t step,
                     std::shared_ptr<const ToolParamTypes> types = nullptr) {
  ToolCallFilter filter(f, types);
  ToolCallStreamer streamer(f, types);
  Streamed s;
  for (size_t at = 0; at < text.size(); at += step) {
    filter.push(text.substr(at, step));
    add_deltas(streamer.update(filter.captured()), &s);
  }
  const ToolParse end = filter.finish();
  add_deltas(streamer.finish(end.calls), &s);
  const ToolParse whole = parse_tool_calls(f, text, types.get());
  EXPECT_EQ(s.names.size(), whole.calls.size()) << text;
  for (size_t i = 0; i < whole.calls.size() && i < s.names.size(); ++i) {
    EXPECT_EQ(s.names[i], whole.calls[i].name);
    EXPECT_EQ(s.arguments[i], whole.calls[i].arguments) << "step " << step;
  }
  return s;
}

const std::string kHermesTwo =
    "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n"
    "</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"a \\\"quoted\\\" {zone}\", \"list\": [1, 2]}}\n"
    "</tool_call>";

TEST(ToolCallStreamer, HermesCallsStreamInPiecesForEverySplit) {
  for (size_t step = 1; step <= 12; ++step) {
    const Streamed s = stream_text(ToolCallFormat::kHermes, kHermesTwo, step);
    ASSERT_EQ(s.names.size(), 2u);
    EXPECT_EQ(s.arguments[1], "{\"tz\":\"a \\\"quoted\\\" {zone}\",\"list\":[1,2]}");
  }
  // Byte by byte the arguments arrive in many deltas, not at the end.
  const Streamed s = stream_text(ToolCallFormat::kHermes, kHermesTwo, 1);
  EXPECT_GT(s.n_deltas, 20u);
}

TEST(ToolCallStreamer, NameComesFirstThenArgumentsAsWritten) {
  ToolCallFilter filter(ToolCallFormat::kHermes);
  ToolCallStreamer streamer(ToolCallFormat::kHermes);
  filter.push("<tool_call>\n{\"name\": \"get_wea");
  EXPECT_TRUE(streamer.update(filter.captured()).empty()) << "the name is not complete yet";
  filter.push("ther\", \"arguments\": {\"ci");
  auto d = streamer.update(filter.captured());
  ASSERT_EQ(d.size(), 1u);
  EXPECT_TRUE(d[0].first);
  EXPECT_EQ(d[0].name, "get_weather");
  EXPECT_EQ(d[0].arguments, "{\"ci");
  filter.push("ty\": \"Par");
  d = streamer.update(filter.captured());
  ASSERT_EQ(d.size(), 1u);
  EXPECT_FALSE(d[0].first);
  EXPECT_EQ(d[0].arguments, "ty\":\"Par");
  filter.push("is\"}}\n</tool_call>");
  d = streamer.update(filter.captured());
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].arguments, "is\"}");
  const ToolParse end = filter.finish();
  EXPECT_TRUE(streamer.finish(end.calls).empty()) << "the stream showed all of it";
}

TEST(ToolCallStreamer, Llama3AndDeepSeekFormats) {
  for (size_t step : {1, 3, 7, 1000}) {
    Streamed s = stream_text(ToolCallFormat::kLlama3,
                             "<|python_tag|>{\"name\": \"f\", \"parameters\": {\"a\": [1, {\"b\": 2}]}}; "
                             "{\"name\": \"g\", \"parameters\": {}}",
                             step);
    EXPECT_EQ(s.names, (std::vector<std::string>{"f", "g"}));
    s = stream_text(ToolCallFormat::kDeepSeek,
                    "Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                    "{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>"
                    "{\"tz\": \"CET\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                    step);
    EXPECT_EQ(s.names, (std::vector<std::string>{"get_weather", "get_time"}));
  }
}

// How many deltas carried arguments before the whole text had arrived.
size_t deltas_before_end(ToolCallFormat f, const std::string& text, std::shared_ptr<const ToolParamTypes> types = nullptr) {
  ToolCallFilter filter(f, types);
  ToolCallStreamer streamer(f, types);
  size_t n = 0;
  for (size_t at = 0; at + 1 < text.size(); ++at) {
    filter.push(text.substr(at, 1));
    for (const auto& d : streamer.update(filter.captured())) n += d.arguments.empty() ? 0 : 1;
  }
  return n;
}

// Qwen3-Coder XML as Qwen/Qwen3-Coder-30B-A3B-Instruct's chat_template.jinja renders it (see
// server_parsers_test.cpp): each parameter streams as JSON, typed by the schema, once it closes.
TEST(ToolCallStreamer, Qwen3CoderParametersStreamAsTypedJson) {
  const auto types = std::make_shared<const ToolParamTypes>(tool_param_types(nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "write_file", "parameters": {"type": "object", "properties": {
      "path": {"type": "string"}, "mode": {"type": "integer"}, "append": {"type": "boolean"}}}}}])")));
  const std::string text =
      "Writing it.\n<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a \"b\".txt\n</parameter>\n"
      "<parameter=content>\ndef f():\n    return {'x': 1}\n</parameter>\n<parameter=mode>\n644\n</parameter>\n"
      "<parameter=append>\nfalse\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=write_file>\n"
      "<parameter=path>\nb\n</parameter>\n</function>\n</tool_call>";
  for (size_t step : {1, 2, 5, 9, 1000}) {
    const Streamed s = stream_text(ToolCallFormat::kQwen3Coder, text, step, types);
    ASSERT_EQ(s.names, (std::vector<std::string>{"write_file", "write_file"}));
    EXPECT_EQ(s.arguments[0],
              "{\"path\":\"/tmp/a \\\"b\\\".txt\",\"content\":\"def f():\\n    return {'x': 1}\",\"mode\":644,\"append\":false}");
    EXPECT_EQ(s.arguments[1], "{\"path\":\"b\"}");
  }
  EXPECT_GE(deltas_before_end(ToolCallFormat::kQwen3Coder, text, types), 6u) << "one delta per parameter at least";
  // A JSON body instead of the XML one: the call comes whole at the end.
  const Streamed s = stream_text(ToolCallFormat::kQwen3Coder, "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", 3);
  EXPECT_EQ(s.names, (std::vector<std::string>{"f"}));
}

// A text parameter (a file's content, say) streams while the model writes it: the newline after
// the tag and the one before </parameter> are not sent, nor a character cut in two.
TEST(ToolCallStreamer, Qwen3CoderTextValuesStreamAsWritten) {
  const std::string text =
      "<tool_call>\n<function=write_file>\n<parameter=content>\nline 1 \"é\" ✓\nline 2\n\n</parameter>\n"
      "<parameter=empty>\n\n</parameter>\n<parameter=open>\nx\n<parameter=last>\ny</parameter>\n</function>\n</tool_call>";
  for (size_t step : {1, 2, 3, 7, 1000}) {
    const Streamed s = stream_text(ToolCallFormat::kQwen3Coder, text, step);
    ASSERT_EQ(s.names.size(), 1u);
    EXPECT_EQ(s.arguments[0], "{\"content\":\"line 1 \\\"é\\\" ✓\\nline 2\\n\",\"empty\":\"\",\"open\":\"x\",\"last\":\"y\"}")
        << "step " << step;
  }
  ToolCallFilter filter(ToolCallFormat::kQwen3Coder);
  ToolCallStreamer streamer(ToolCallFormat::kQwen3Coder);
  filter.push("<tool_call>\n<function=write_file>\n<parameter=content>\ndef f():\n");
  auto d = streamer.update(filter.captured());
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].arguments, "{\"content\":\"def f():") << "the last newline may end the value: held";
  filter.push("    return 1\n");
  d = streamer.update(filter.captured());
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].arguments, "\\n    return 1");
}

// Mistral, both forms (templates cited in server_parsers_test.cpp): the arguments object streams
// through as it is written.
TEST(ToolCallStreamer, MistralBothForms) {
  const std::string list =
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": [1, 2]}, \"id\": \"abc123def\"}, "
      "{\"name\": \"get_time\", \"arguments\": {\"tz\": \"CET\"}, \"id\": \"xyz987uvw\"}]";
  const std::string args =
      "Sure.[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\", \"days\": [1, 2]}[TOOL_CALLS]get_time[CALL_ID]abc123def[ARGS]{\"tz\": \"CET\"}";
  for (size_t step : {1, 3, 7, 1000}) {
    for (const std::string& text : {list, args}) {
      const Streamed s = stream_text(ToolCallFormat::kMistral, text, step);
      ASSERT_EQ(s.names, (std::vector<std::string>{"get_weather", "get_time"})) << text;
      EXPECT_EQ(s.arguments[0], "{\"city\":\"Paris\",\"days\":[1,2]}");
    }
  }
  EXPECT_GT(deltas_before_end(ToolCallFormat::kMistral, args), 20u);
  EXPECT_GT(deltas_before_end(ToolCallFormat::kMistral, list), 20u);
}

// Gemma 4 (google/gemma-4-E4B-it, chat_template.jinja; see server_parsers_test.cpp): each
// top-level argument streams as JSON once its value is complete.
TEST(ToolCallStreamer, Gemma4ArgumentsStreamAsJson) {
  const std::string text =
      "<|tool_call>call:get_weather{city:<|\"|>Paris, {\"centre\"}<|\"|>,days:3,where:{lat:48.85,tags:[<|\"|>a<|\"|>,true]},"
      "zip:null}<tool_call|><|tool_call>call:get_time{}<tool_call|><|tool_response>";
  for (size_t step : {1, 2, 4, 11, 1000}) {
    const Streamed s = stream_text(ToolCallFormat::kGemma4, text, step);
    ASSERT_EQ(s.names, (std::vector<std::string>{"get_weather", "get_time"}));
    EXPECT_EQ(s.arguments[0], "{\"city\":\"Paris, {\\\"centre\\\"}\",\"days\":3,\"where\":{\"lat\":48.85,\"tags\":[\"a\",true]},\"zip\":null}");
    EXPECT_EQ(s.arguments[1], "{}");
  }
  EXPECT_GE(deltas_before_end(ToolCallFormat::kGemma4, text), 5u);
}

TEST(ToolCallStreamer, ShapesItDoesNotKnowComeWholeAtTheEnd) {
  // arguments before name, and arguments as a JSON string: only the whole parse reads them.
  for (const std::string text : {"<tool_call>{\"arguments\": {\"a\": 1}, \"name\": \"f\"}</tool_call>",
                                 "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"a\\\": 1}\"}</tool_call>"}) {
    ToolCallFilter filter(ToolCallFormat::kHermes);
    ToolCallStreamer streamer(ToolCallFormat::kHermes);
    filter.push(text);
    EXPECT_TRUE(streamer.update(filter.captured()).empty()) << text;
    const ToolParse end = filter.finish();
    ASSERT_EQ(end.calls.size(), 1u);
    const auto d = streamer.finish(end.calls);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_TRUE(d[0].first);
    EXPECT_EQ(d[0].name, "f");
    EXPECT_EQ(d[0].arguments, "{\"a\":1}");
  }
  // Not a call at all: nothing streams and the text stays content.
  const Streamed s = stream_text(ToolCallFormat::kHermes, "a <tool_call> that is not JSON", 2);
  EXPECT_TRUE(s.names.empty());
}

TEST(ToolCallStreamer, ThroughTheAssemblerWithQwen3Tokens) {
  const tokenizer::Tokenizer& tok = tokenizer::testing::reference_tokenizer("qwen3");
  auto ids = tok.encode(kHermesTwo, false);
  ASSERT_TRUE(ids.ok());
  OutputOptions o;
  o.tools = ToolCallFormat::kHermes;
  OutputAssembler a(tok, o);
  Streamed s;
  std::string content;
  size_t deltas_before_end = 0;
  for (int32_t id : *ids) {
    OutputDelta d = a.push({id}, {});
    content += d.content;
    add_deltas(d.tool_calls, &s);
    deltas_before_end = s.n_deltas;
  }
  std::vector<ToolCall> calls;
  OutputDelta last = a.finish(&calls);
  content += last.content;
  add_deltas(last.tool_calls, &s);
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(content, "Let me check.\n");
  EXPECT_EQ(s.names, (std::vector<std::string>{"get_weather", "get_time"}));
  EXPECT_EQ(s.arguments[0], calls[0].arguments);
  EXPECT_EQ(s.arguments[1], calls[1].arguments);
  EXPECT_GT(deltas_before_end, 6u) << "the calls streamed while the model wrote them";
}

// The chunks a client sees: the first delta of a call has index, id, type and name; later ones
// the index and arguments; the body has the same ids.
TEST(ToolCallStreamer, OpenAiChunksAndBodyAgree) {
  const tokenizer::Tokenizer& tok = tokenizer::testing::reference_tokenizer("qwen3");
  ResponseContext c;
  c.id = "chatcmpl-1";
  auto b = make_response_builder(ApiKind::kChat, c, tok);
  std::string sse = b->start();
  OutputDelta d;
  d.tool_calls = {{0, true, "get_weather", "{\"city\""}};
  sse += b->delta(d);
  d.tool_calls = {{0, false, "", ":\"Paris\"}"}};
  sse += b->delta(d);
  FinishState f;
  OutputDelta last;
  last.tool_calls = {{1, true, "get_time", "{}"}};
  sse += b->finish(last, {{"get_weather", "{\"city\":\"Paris\"}"}, {"get_time", "{}"}}, f);
  std::map<int, json> calls;
  std::string finish_reason;
  for (size_t p = sse.find("data: {"); p != std::string::npos; p = sse.find("data: {", p + 1)) {
    const json c = json::parse(sse.substr(p + 6, sse.find("\n\n", p) - p - 6));
    if (c["choices"].empty()) continue;
    const json& ch = c["choices"][0];
    if (ch["finish_reason"].is_string()) finish_reason = ch["finish_reason"];
    if (!ch["delta"].contains("tool_calls")) continue;
    for (const auto& t : ch["delta"]["tool_calls"]) {
      const int i = t["index"];
      if (t.contains("id")) {
        ASSERT_FALSE(calls.count(i));
        EXPECT_EQ(t["type"], "function");
        calls[i] = t;
      } else {
        ASSERT_TRUE(calls.count(i));
        EXPECT_FALSE(t["function"].contains("name"));
        calls[i]["function"]["arguments"] = calls[i]["function"]["arguments"].get<std::string>() +
                                            t["function"]["arguments"].get<std::string>();
      }
    }
  }
  EXPECT_EQ(finish_reason, "tool_calls");
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
  const json body = b->body();
  const json& bc = body["choices"][0]["message"]["tool_calls"];
  ASSERT_EQ(bc.size(), 2u);
  EXPECT_EQ(bc[0]["id"], calls[0]["id"]);
  EXPECT_EQ(bc[1]["id"], calls[1]["id"]);
  EXPECT_EQ(bc[1]["function"]["name"], "get_time");
}

TEST(ToolCallStreamer, AnthropicToolUseBlocksStreamTheirInput) {
  const tokenizer::Tokenizer& tok = tokenizer::testing::reference_tokenizer("qwen3");
  auto b = make_response_builder(ApiKind::kMessages, ResponseContext{}, tok);
  std::string sse = b->start();
  OutputDelta d;
  d.content = "Checking.";
  sse += b->delta(d);
  d = OutputDelta{};
  d.tool_calls = {{0, true, "get_weather", "{\"city\""}};
  sse += b->delta(d);
  d.tool_calls = {{0, false, "", ":\"Paris\"}"}};
  sse += b->delta(d);
  sse += b->finish(OutputDelta{}, {{"get_weather", "{\"city\":\"Paris\"}"}}, FinishState{});
  std::vector<std::string> events;
  std::string input, block_id;
  for (size_t p = sse.find("event: "); p != std::string::npos; p = sse.find("event: ", p + 1)) {
    events.push_back(sse.substr(p + 7, sse.find('\n', p) - p - 7));
    const size_t data = sse.find("data: ", p) + 6;
    const json j = json::parse(sse.substr(data, sse.find("\n\n", data) - data));
    if (j["type"] == "content_block_start" && j["content_block"]["type"] == "tool_use") block_id = j["content_block"]["id"];
    if (j["type"] == "content_block_delta" && j["delta"]["type"] == "input_json_delta") input += j["delta"]["partial_json"].get<std::string>();
  }
  const std::vector<std::string> want = {"message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
                                         "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
                                         "message_delta", "message_stop"};
  EXPECT_EQ(events, want);
  EXPECT_EQ(input, "{\"city\":\"Paris\"}");
  const json body = b->body();
  EXPECT_EQ(body["stop_reason"], "tool_use");
  EXPECT_EQ(body["content"][1]["id"], block_id);
  EXPECT_EQ(body["content"][1]["input"]["city"], "Paris");
}

}  // namespace
}  // namespace strata::server
