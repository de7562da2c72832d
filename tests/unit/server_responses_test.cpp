// The Responses API: request parsing into chat messages (every input item type), its errors,
// previous_response_id through the store (TTL, bytes), and the stream events and body.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/responses_api.h"

namespace strata::server {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;

const ParseLimits kLimits{{"m"}};

ApiError responses_error(const json& body) {
  ResponsesRequest r;
  auto e = parse_responses_request(body, kLimits, &r);
  EXPECT_TRUE(e.has_value()) << body.dump();
  return e.value_or(ApiError{});
}

TEST(ResponsesRequest, InputItemsBecomeChatMessages) {
  const json body = {
      {"model", "m"},
      {"instructions", "Be brief."},
      {"input",
       {{{"role", "developer"}, {"content", "Use tools."}},
        {{"type", "message"}, {"role", "user"}, {"content", {{{"type", "input_text"}, {"text", "Weather in"}}, {{"type", "input_text"}, {"text", "Paris?"}}}}},
        {{"type", "reasoning"}, {"id", "rs_1"}, {"summary", {{{"type", "summary_text"}, {"text", "need the tool"}}}}},
        {{"type", "function_call"}, {"call_id", "call_1"}, {"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}},
        {{"type", "function_call_output"}, {"call_id", "call_1"}, {"output", "18 C"}},
        {{"role", "assistant"}, {"content", {{{"type", "output_text"}, {"text", "It is 18 C."}}}}},
        {{"role", "user"}, {"content", "Thanks"}}}},
      {"tools", {{{"type", "function"}, {"name", "get_weather"}, {"description", "Weather"}, {"parameters", {{"type", "object"}}}}}},
      {"tool_choice", "auto"}, {"max_output_tokens", 9}, {"temperature", 0.5}, {"top_p", 0.9}, {"store", false},
      {"metadata", {{"k", "v"}}}, {"reasoning", {{"effort", "low"}}}, {"text", {{"format", {{"type", "text"}}}}},
      {"include", {"reasoning.encrypted_content"}}, {"parallel_tool_calls", false}, {"unknown_field", 1}};
  ResponsesRequest r;
  ASSERT_FALSE(parse_responses_request(body, kLimits, &r).has_value());
  ResponseStore store(60, 1 << 20);
  ASSERT_FALSE(resolve_previous_response(store, &r).has_value());
  const auto& m = r.api.messages;
  ASSERT_EQ(m.size(), 7u) << m.dump();
  EXPECT_EQ(m[0], ojson({{"role", "system"}, {"content", "Be brief."}}));
  EXPECT_EQ(m[1]["role"], "system");
  EXPECT_EQ(m[2]["content"], "Weather in\nParis?");
  EXPECT_EQ(m[3]["role"], "assistant");
  EXPECT_EQ(m[3]["reasoning_content"], "need the tool");
  EXPECT_EQ(m[3]["tool_calls"][0]["id"], "call_1");
  EXPECT_EQ(m[3]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");  // an object for the template
  EXPECT_EQ(m[4], ojson({{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "18 C"}}));
  EXPECT_EQ(m[5]["content"], "It is 18 C.");
  EXPECT_EQ(m[6]["content"], "Thanks");
  EXPECT_EQ(r.conversation.size(), 6u) << "instructions are not part of the stored conversation";
  EXPECT_EQ(r.api.tools[0]["function"]["name"], "get_weather");
  EXPECT_EQ(r.api.max_tokens, 9);
  EXPECT_FLOAT_EQ(*r.api.temperature, 0.5f);
  EXPECT_FALSE(r.store);
  EXPECT_EQ(r.echo["tools"][0]["name"], "get_weather");
  EXPECT_EQ(r.echo["metadata"]["k"], "v");
  EXPECT_EQ(r.echo["parallel_tool_calls"], false);
  EXPECT_EQ(r.echo["reasoning"]["effort"], "low");

  ResponsesRequest s;
  ASSERT_FALSE(parse_responses_request({{"input", "hi"}}, kLimits, &s).has_value());
  EXPECT_EQ(s.input, ojson::array({{{"role", "user"}, {"content", "hi"}}}));
  EXPECT_TRUE(s.store);
}

TEST(ResponsesRequest, ErrorsNameTheFieldAndTheValue) {
  struct Case {
    json body;
    std::string param, needle;
  };
  const std::vector<Case> cases = {
      {json::object(), "input", "required"},
      {{{"input", ""}}, "input", "empty"},
      {{{"input", json::array()}}, "input", "[]"},
      {{{"input", 3}}, "input", "number 3"},
      {{{"input", {{{"type", "input_image"}, {"image_url", "x"}}}}}, "input[0].type", "'input_image'"},
      {{{"input", {{{"role", "critic"}, {"content", "x"}}}}}, "input[0].role", "'critic'"},
      {{{"input", {{{"role", "user"}, {"content", {{{"type", "input_image"}}}}}}}}, "input[0].content[0].type", "'input_image'"},
      {{{"input", {{{"type", "function_call"}, {"name", "f"}, {"arguments", "{}"}}}}}, "input[0].call_id", "required"},
      {{{"input", {{{"type", "function_call"}, {"call_id", "c"}, {"name", "f"}, {"arguments", "{nope"}}}}},
       "input[0].arguments", "{nope"},
      {{{"input", {{{"type", "function_call_output"}, {"call_id", "c"}}}}}, "input[0].output", "required"},
      {{{"input", "hi"}, {"model", "other"}}, "model", "'other'"},
      {{{"input", "hi"}, {"instructions", 5}}, "instructions", "number 5"},
      {{{"input", "hi"}, {"max_output_tokens", 0}}, "max_output_tokens", "got 0"},
      {{{"input", "hi"}, {"max_output_tokens", "x"}}, "max_output_tokens", "\"x\""},
      {{{"input", "hi"}, {"temperature", 3}}, "temperature", "got 3"},
      {{{"input", "hi"}, {"top_p", 1.5}}, "top_p", "got 1.5"},
      {{{"input", "hi"}, {"store", "yes"}}, "store", "\"yes\""},
      {{{"input", "hi"}, {"stream", 1}}, "stream", "number 1"},
      {{{"input", "hi"}, {"previous_response_id", 7}}, "previous_response_id", "number 7"},
      {{{"input", "hi"}, {"previous_response_id", ""}}, "previous_response_id", "empty"},
      {{{"input", "hi"}, {"tools", {{{"type", "web_search"}}}}}, "tools[0].type", "'web_search'"},
      {{{"input", "hi"}, {"tools", {{{"type", "function"}}}}}, "tools[0].name", "required"},
      {{{"input", "hi"}, {"tools", {{{"type", "function"}, {"name", "f"}, {"parameters", "x"}}}}}, "tools[0].parameters", "\"x\""},
      {{{"input", "hi"}, {"tool_choice", {{"type", "function"}}}}, "tool_choice.name", "name"},
      {{{"input", "hi"}, {"tool_choice", "maybe"}}, "tool_choice", "'maybe'"},
      {{{"input", "hi"}, {"text", {{"format", {{"type", "json_schema"}}}}}}, "text.format.name", "needs a name"},
      {{{"input", "hi"}, {"text", {{"format", {{"type", "xml"}}}}}}, "text.format.type", "\"xml\""},
      {{{"input", "hi"}, {"text", {{"format", {{"type", "json_schema"}, {"name", "n"}, {"schema", 3}}}}}}, "text.format.schema", "3"},
      {{{"input", "hi"}, {"text", {{"format", {{"type", "json_schema"}, {"name", "n"}, {"schema", {{"type", "object"}}}, {"indent", 2}}}}}},
       "text.format.indent", "not a field"},
      {{{"input", "hi"}, {"reasoning", {{"effort", "huge"}}}}, "reasoning.effort", "\"huge\""},
      {{{"input", "hi"}, {"truncation", "sometimes"}}, "truncation", "\"sometimes\""},
      {{{"input", "hi"}, {"metadata", {{"k", 1}}}}, "metadata.k", "number 1"},
      {{{"input", "hi"}, {"background", true}}, "background", "not supported"},
      {{{"input", "hi"}, {"conversation", "conv_1"}}, "conversation", "not supported"},
      {{{"input", "hi"}, {"parallel_tool_calls", "no"}}, "parallel_tool_calls", "\"no\""},
  };
  for (const auto& c : cases) {
    const ApiError e = responses_error(c.body);
    EXPECT_EQ(e.param, c.param) << c.body.dump() << " -> " << e.message;
    EXPECT_NE(e.message.find(c.needle), std::string::npos) << c.body.dump() << " -> " << e.message;
    EXPECT_EQ(e.status, c.param == "model" ? 404 : 400);
  }
}

// text.format json_schema / json_object compile as chat's response_format does; tool_choice
// required and a named function are forced through the tool-call grammar at mapping time.
TEST(ResponsesRequest, TextFormatAndForcedToolChoice) {
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}, {"required", {"a"}}};
  ResponsesRequest r;
  auto e = parse_responses_request(
      {{"input", "hi"}, {"text", {{"format", {{"type", "json_schema"}, {"name", "n"}, {"schema", schema}, {"strict", true}}}}}},
      kLimits, &r);
  ASSERT_FALSE(e) << e->message;
  ASSERT_TRUE(r.api.constraint);
  EXPECT_EQ(r.api.constraint->spec.kind, grammar::GrammarKind::kJsonSchema);
  EXPECT_EQ(json::parse(r.api.constraint->spec.text), schema);
  EXPECT_TRUE(r.api.constraint->spec.json.strict);
  EXPECT_EQ(r.api.constraint->field.rfind("text.format", 0), 0u) << r.api.constraint->field;
  EXPECT_EQ(r.echo["text"]["format"]["name"], "n");

  ResponsesRequest o;
  ASSERT_FALSE(parse_responses_request({{"input", "hi"}, {"text", {{"format", {{"type", "json_object"}}}}}}, kLimits, &o));
  ASSERT_TRUE(o.api.constraint);
  ResponsesRequest t;
  ASSERT_FALSE(parse_responses_request({{"input", "hi"}, {"text", {{"format", {{"type", "text"}}}}}}, kLimits, &t));
  EXPECT_FALSE(t.api.constraint);

  const json tools = {{{"type", "function"}, {"name", "f"}, {"parameters", {{"type", "object"}}}, {"strict", true}}};
  ResponsesRequest q;
  ASSERT_FALSE(parse_responses_request({{"input", "hi"}, {"tools", tools}, {"tool_choice", "required"}}, kLimits, &q));
  EXPECT_EQ(q.api.tool_choice, "required");
  EXPECT_EQ(q.api.strict_tools, std::vector<std::string>{"f"});
  ResponsesRequest n;
  ASSERT_FALSE(parse_responses_request({{"input", "hi"}, {"tools", tools}, {"tool_choice", {{"type", "function"}, {"name", "f"}}}},
                                       kLimits, &n));
  EXPECT_EQ(n.api.tool_choice, "function");
  EXPECT_EQ(n.api.tool_choice_name, "f");
  EXPECT_EQ(n.echo["tool_choice"], (json{{"type", "function"}, {"name", "f"}}));
}

TEST(ResponsesRequest, PreviousResponseContinuesTheStoredConversation) {
  ResponseStore store(60, 1 << 20);
  ResponsesRequest r;
  ASSERT_FALSE(parse_responses_request({{"input", "hi"}, {"previous_response_id", "resp_x"}}, kLimits, &r));
  auto e = resolve_previous_response(store, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 404);
  EXPECT_EQ(e->param, "previous_response_id");
  EXPECT_NE(e->message.find("'resp_x'"), std::string::npos);

  json conv = json::array({{{"role", "user"}, {"content", "a"}}, {{"role", "assistant"}, {"content", "b"}}});
  store.put("resp_x", StoredResponse{conv, {{"id", "resp_x"}}});
  ASSERT_FALSE(parse_responses_request({{"input", "c"}, {"previous_response_id", "resp_x"}, {"instructions", "I"}}, kLimits, &r));
  ASSERT_FALSE(resolve_previous_response(store, &r));
  ASSERT_EQ(r.api.messages.size(), 4u);
  EXPECT_EQ(r.api.messages[0]["content"], "I");
  EXPECT_EQ(r.api.messages[1]["content"], "a");
  EXPECT_EQ(r.api.messages[3]["content"], "c");
  EXPECT_EQ(r.conversation.size(), 3u);
}

TEST(ResponseStore, TtlAndByteLimit) {
  ResponseStore store(10, 300);
  const auto t0 = ResponseStore::Clock::now();
  store.set_now_for_test(t0);
  const json big = json::array({{{"role", "user"}, {"content", std::string(100, 'x')}}});
  store.put("a", StoredResponse{big, json::object()});
  store.put("b", StoredResponse{big, json::object()});
  EXPECT_TRUE(store.get("a"));
  store.put("c", StoredResponse{big, json::object()});  // past 400 bytes: the oldest goes
  EXPECT_FALSE(store.get("a"));
  EXPECT_TRUE(store.get("b"));
  EXPECT_TRUE(store.get("c"));
  EXPECT_EQ(store.stats().evicted, 1);
  store.put("huge", StoredResponse{json::array({std::string(1000, 'y')}), json::object()});
  EXPECT_FALSE(store.get("huge")) << "larger than the whole limit";
  store.set_now_for_test(t0 + std::chrono::seconds(11));
  EXPECT_FALSE(store.get("b"));
  EXPECT_EQ(store.stats().entries, 0);
  EXPECT_EQ(store.stats().expired, 2);
  // Model text that is not valid UTF-8 is stored, not thrown on.
  store.put("bad", StoredResponse{json::array({{{"role", "assistant"}, {"content", "\xff\xfe"}}}), json::object()});
  EXPECT_TRUE(store.get("bad"));
  store.put("d", StoredResponse{big, json::object()});
  EXPECT_TRUE(store.erase("d"));
  EXPECT_FALSE(store.get("d"));
}

struct Event {
  std::string type;
  json data;
};

std::vector<Event> events_of(const std::string& sse) {
  std::vector<Event> out;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    EXPECT_NE(end, std::string::npos);
    if (end == std::string::npos) break;
    const std::string ev = sse.substr(pos, end - pos);
    const size_t nl = ev.find('\n');
    EXPECT_EQ(ev.rfind("event: ", 0), 0u);
    Event e{ev.substr(7, nl - 7), json::parse(ev.substr(nl + 7))};
    EXPECT_EQ(e.data["type"], e.type);
    out.push_back(std::move(e));
    pos = end + 2;
  }
  return out;
}

TEST(ResponsesBuilder, StreamEventsAndBody) {
  ResponseContext c;
  c.id = "resp_1";
  c.model = "m";
  c.created = 5;
  json echo = {{"store", true}, {"tools", json::array()}};
  ResponsesBuilder b(c, echo);
  std::string sse = b.start();
  OutputDelta d;
  d.reasoning = "hmm";
  sse += b.delta(d);
  d = OutputDelta{};
  d.content = "Let me ";
  sse += b.delta(d);
  d.content = "check.";
  sse += b.delta(d);
  d = OutputDelta{};
  d.tool_calls = {{0, true, "get_weather", "{\"city\""}};
  sse += b.delta(d);
  OutputDelta last;
  last.tool_calls = {{0, false, "", ":\"Paris\"}"}};
  FinishState f;
  f.usage = {40, 12, 32};
  sse += b.finish(last, {{"get_weather", "{\"city\":\"Paris\"}"}}, f);
  const auto ev = events_of(sse);
  std::vector<std::string> types;
  for (size_t i = 0; i < ev.size(); ++i) {
    types.push_back(ev[i].type);
    EXPECT_EQ(ev[i].data["sequence_number"], int(i));
  }
  const std::vector<std::string> want = {
      "response.created", "response.in_progress",
      "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
      "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.content_part.added", "response.output_text.delta", "response.output_text.delta",
      "response.output_text.done", "response.content_part.done", "response.output_item.done",
      "response.output_item.added", "response.function_call_arguments.delta", "response.function_call_arguments.delta",
      "response.function_call_arguments.done", "response.output_item.done", "response.completed"};
  EXPECT_EQ(types, want);
  EXPECT_EQ(ev[0].data["response"]["status"], "in_progress");
  EXPECT_EQ(ev[12].data["text"], "Let me check.");
  EXPECT_EQ(ev[18].data["arguments"], "{\"city\":\"Paris\"}");
  const json body = b.body();
  EXPECT_EQ(ev.back().data["response"], body);
  EXPECT_EQ(body["object"], "response");
  EXPECT_EQ(body["status"], "completed");
  ASSERT_EQ(body["output"].size(), 3u);
  EXPECT_EQ(body["output"][1]["content"][0]["text"], "Let me check.");
  EXPECT_EQ(body["output"][2]["type"], "function_call");
  EXPECT_EQ(body["output"][2]["name"], "get_weather");
  EXPECT_EQ(body["output"][2]["status"], "completed");
  EXPECT_EQ(body["usage"]["input_tokens"], 40);
  EXPECT_EQ(body["usage"]["input_tokens_details"]["cached_tokens"], 32);
  EXPECT_EQ(body["usage"]["total_tokens"], 52);
  const auto m = b.assistant_message();
  EXPECT_EQ(m["content"], "Let me check.");
  EXPECT_EQ(m["reasoning_content"], "hmm");
  EXPECT_EQ(m["tool_calls"][0]["id"], body["output"][2]["call_id"]);
  EXPECT_EQ(m["tool_calls"][0]["function"]["arguments"]["city"], "Paris");
}

// A stream resumed under --supervise replays the same tokens into a new builder with the same
// response id: its items must carry the same ids.
TEST(ResponsesBuilder, ItemIdsFollowFromTheResponseId) {
  auto ids = [](const std::string& response_id) {
    ResponseContext c;
    c.id = response_id;
    ResponsesBuilder b(c, json::object());
    b.start();
    OutputDelta d;
    d.content = "x";
    b.delta(d);
    d = OutputDelta{};
    d.tool_calls = {{0, true, "f", "{}"}};
    b.delta(d);
    b.finish(OutputDelta{}, {{"f", "{}"}}, FinishState{});
    const json body = b.body();
    return std::vector<std::string>{body["output"][0]["id"], body["output"][1]["id"], body["output"][1]["call_id"]};
  };
  const auto a = ids("resp_a");
  EXPECT_EQ(a, ids("resp_a"));
  EXPECT_EQ(a[0].rfind("msg_", 0), 0u);
  EXPECT_EQ(a[1].rfind("fc_", 0), 0u);
  EXPECT_EQ(a[2].rfind("call_", 0), 0u);
  const auto b = ids("resp_b");
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NE(a[i], b[i]);
}

TEST(ResponsesBuilder, CutByMaxOutputTokensIsIncomplete) {
  ResponseContext c;
  c.id = "resp_2";
  ResponsesBuilder b(c, json::object());
  b.start();
  OutputDelta d;
  d.content = "partial";
  b.delta(d);
  FinishState f;
  f.reason = FinishReason::kLength;
  const auto ev = events_of(b.finish(OutputDelta{}, {}, f));
  EXPECT_EQ(ev.back().type, "response.incomplete");
  EXPECT_EQ(b.body()["status"], "incomplete");
  EXPECT_EQ(b.body()["incomplete_details"]["reason"], "max_output_tokens");
  EXPECT_EQ(b.body()["output"][0]["status"], "incomplete");
  EXPECT_EQ(ev[ev.size() - 2].type, "response.output_item.done");
  EXPECT_EQ(ev[ev.size() - 2].data["item"]["status"], "incomplete");
  ApiError e;
  e.status = 500;
  e.message = "boom";
  const auto err = events_of(b.stream_error(e));
  ASSERT_EQ(err.size(), 1u);
  EXPECT_EQ(err[0].type, "error");
  EXPECT_EQ(err[0].data["message"], "boom");
}

}  // namespace
}  // namespace strata::server
