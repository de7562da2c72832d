// Request validation (pure, over parsed JSON), request mapping with real tokenizers and chat
// templates, response and SSE rendering, and the metrics text.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "server/api_request.h"
#include "server/api_response.h"
#include "server/metrics.h"
#include "server/request_mapping.h"
#include "tokenizer_test_util.h"

namespace strata::server {
namespace {

using json = nlohmann::json;

const ParseLimits kLimits{{"strata-demo"}};

ApiError chat_error(const json& body) {
  ApiRequest r;
  auto e = parse_chat_request(body, kLimits, &r);
  EXPECT_TRUE(e.has_value()) << body.dump();
  return e.value_or(ApiError{});
}

ApiError completion_error(const json& body) {
  ApiRequest r;
  auto e = parse_completion_request(body, kLimits, &r);
  EXPECT_TRUE(e.has_value()) << body.dump();
  return e.value_or(ApiError{});
}

const json kMsgs = json::array({{{"role", "user"}, {"content", "hi"}}});

TEST(ApiRequest, ParsesAFullChatRequest) {
  const json body = {{"model", "strata-demo"},
                     {"messages", {{{"role", "developer"}, {"content", "Be brief."}},
                                   {{"role", "user"}, {"content", {{{"type", "text"}, {"text", "a"}}, {{"type", "text"}, {"text", "b"}}}}},
                                   {{"role", "assistant"}, {"content", nullptr},
                                    {"tool_calls", {{{"id", "call_1"}, {"type", "function"},
                                                     {"function", {{"name", "f"}, {"arguments", "{\"x\": 1}"}}}}}}},
                                   {{"role", "tool"}, {"tool_call_id", "call_1"}, {"content", "42"}}}},
                     {"max_completion_tokens", 7}, {"temperature", 0.5}, {"top_k", -1}, {"seed", 3},
                     {"stop", "END"}, {"logprobs", true}, {"top_logprobs", 5}, {"logit_bias", {{"17", -100}}},
                     {"stream", true}, {"stream_options", {{"include_usage", true}}}, {"some_unknown_field", {1, 2}},
                     {"session_id", "s1"}, {"priority", -2}, {"response_format", {{"type", "text"}}}, {"n", 1}};
  ApiRequest r;
  ASSERT_FALSE(parse_chat_request(body, kLimits, &r).has_value());
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[1]["content"], "a\nb");
  EXPECT_EQ(r.messages[2]["content"], "");  // null content reaches templates as ""
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"]["x"], 1);  // an object for the template
  EXPECT_EQ(r.messages[3]["tool_call_id"], "call_1");
  EXPECT_EQ(r.max_tokens, 7);
  EXPECT_FLOAT_EQ(*r.temperature, 0.5f);
  EXPECT_EQ(r.top_k, 0);
  EXPECT_EQ(r.seed, 3u);
  EXPECT_EQ(r.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(r.logprobs, 5);
  ASSERT_EQ(r.logit_bias.size(), 1u);
  EXPECT_EQ(r.logit_bias[0].first, 17);
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.session_id, "s1");
  EXPECT_EQ(r.priority, -2);
}

TEST(ApiRequest, ChatErrorsNameTheFieldAndTheValue) {
  ApiError e = chat_error({{"messages", json::array()}});
  EXPECT_EQ(e.param, "messages");
  e = chat_error({{"messages", "hello"}});
  EXPECT_EQ(e.param, "messages");
  EXPECT_NE(e.message.find("\"hello\""), std::string::npos) << e.message;
  e = chat_error({{"model", "gpt-4"}, {"messages", kMsgs}});
  EXPECT_EQ(e.status, 404);
  EXPECT_NE(e.message.find("gpt-4"), std::string::npos);
  e = chat_error({{"messages", kMsgs}, {"max_tokens", 0}});
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("got 0"), std::string::npos);
  e = chat_error({{"messages", kMsgs}, {"max_tokens", "ten"}});
  EXPECT_EQ(e.param, "max_tokens");
  EXPECT_NE(e.message.find("string"), std::string::npos);
  for (const json& bad_n : {json(0), json(-1), json(129), json("2"), json(1.5)}) {
    e = chat_error({{"messages", kMsgs}, {"n", bad_n}});
    EXPECT_EQ(e.param, "n") << bad_n;
    EXPECT_NE(e.message.find(bad_n.dump()), std::string::npos) << e.message;
  }
  e = chat_error({{"messages", kMsgs}, {"response_format", {{"type", "xml"}}}});
  EXPECT_EQ(e.param, "response_format.type");
  EXPECT_NE(e.message.find("xml"), std::string::npos);
  e = chat_error({{"messages", kMsgs}, {"response_format", {{"type", "json_schema"}}}});
  EXPECT_EQ(e.param, "response_format.json_schema");
  e = chat_error({{"messages", kMsgs}, {"guided_regex", "a"}, {"structured_outputs", {{"choice", {"a"}}}}});
  EXPECT_EQ(e.param, "guided_regex");
  EXPECT_NE(e.message.find("both constrain"), std::string::npos);
  e = chat_error({{"messages", kMsgs}, {"guided_choice", json::array()}});
  EXPECT_EQ(e.param, "guided_choice");
  e = chat_error({{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}, {"image_url", {{"url", "x"}}}}}}}}}});
  EXPECT_EQ(e.param, "messages[0].content[0].type");
  EXPECT_NE(e.message.find("image_url"), std::string::npos);
  e = chat_error({{"messages", {{{"role", "wizard"}, {"content", "x"}}}}});
  EXPECT_EQ(e.param, "messages[0].role");
  e = chat_error({{"messages", kMsgs}, {"top_logprobs", 21}, {"logprobs", true}});
  EXPECT_EQ(e.param, "top_logprobs");
  e = chat_error({{"messages", kMsgs}, {"stream_options", {{"include_usage", true}}}});
  EXPECT_EQ(e.param, "stream_options");
  e = chat_error({{"messages", kMsgs}, {"logit_bias", {{"abc", 1}}}});
  EXPECT_EQ(e.param, "logit_bias");
  e = chat_error({{"messages", kMsgs}, {"stop", {"a", ""}}});
  EXPECT_EQ(e.param, "stop");
  e = chat_error({{"messages", kMsgs}, {"tool_choice", "required"}});
  EXPECT_EQ(e.param, "tool_choice");
  e = chat_error(json::array());
  EXPECT_EQ(e.param, "body");
}

TEST(ApiRequest, ParsesOutputConstraints) {
  using strata::grammar::GrammarKind;
  const json msgs = {{{"role", "user"}, {"content", "hi"}}};
  ApiRequest r;
  ASSERT_FALSE(parse_chat_request({{"messages", msgs}}, kLimits, &r).has_value());
  EXPECT_FALSE(r.constraint.has_value());
  const json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  ASSERT_FALSE(parse_chat_request({{"messages", msgs}, {"response_format", {{"type", "json_schema"},
                                   {"json_schema", {{"name", "s"}, {"schema", schema}, {"strict", true}}}}}}, kLimits, &r));
  ASSERT_TRUE(r.constraint.has_value());
  EXPECT_EQ(r.constraint->spec.kind, GrammarKind::kJsonSchema);
  EXPECT_TRUE(r.constraint->spec.json.strict);
  EXPECT_EQ(json::parse(r.constraint->spec.text), schema);
  EXPECT_EQ(r.constraint->field, "response_format.json_schema.schema");
  ASSERT_FALSE(parse_chat_request({{"messages", msgs}, {"response_format", {{"type", "json_object"}}}}, kLimits, &r));
  EXPECT_EQ(r.constraint->spec.kind, GrammarKind::kJsonObject);
  ASSERT_FALSE(parse_completion_request({{"prompt", "x"}, {"structured_outputs", {{"regex", "[a-z]+"}}}}, kLimits, &r));
  EXPECT_EQ(r.constraint->spec.kind, GrammarKind::kRegex);
  EXPECT_EQ(r.constraint->spec.text, "[a-z]+");
  ASSERT_FALSE(parse_completion_request({{"prompt", "x"}, {"guided_choice", {"yes", "no"}}}, kLimits, &r));
  EXPECT_EQ(r.constraint->spec.kind, GrammarKind::kChoice);
  EXPECT_EQ(json::parse(r.constraint->spec.text), json({"yes", "no"}));
  ASSERT_FALSE(parse_completion_request({{"prompt", "x"}, {"guided_json", "{\"type\":\"string\"}"}}, kLimits, &r));
  EXPECT_EQ(r.constraint->spec.text, "{\"type\":\"string\"}");
  ASSERT_FALSE(parse_completion_request({{"prompt", "x"}, {"guided_grammar", "root ::= \"a\""}}, kLimits, &r));
  EXPECT_EQ(r.constraint->spec.kind, GrammarKind::kEbnf);
  // JSON whitespace: compact unless disable_any_whitespace is false.
  EXPECT_EQ(r.constraint->spec.json.whitespace, strata::grammar::JsonWhitespace::kCompact);
  for (const bool disable : {true, false}) {
    ASSERT_FALSE(parse_completion_request({{"prompt", "x"}, {"structured_outputs", {{"disable_any_whitespace", disable},
                                           {"json", schema}}}}, kLimits, &r));
    EXPECT_EQ(r.constraint->spec.json.whitespace,
              disable ? strata::grammar::JsonWhitespace::kCompact : strata::grammar::JsonWhitespace::kFlexible);
  }
  ASSERT_FALSE(parse_completion_request({{"prompt", "x"}, {"structured_outputs", {{"json", schema}}}}, kLimits, &r));
  EXPECT_EQ(r.constraint->spec.json.whitespace, strata::grammar::JsonWhitespace::kCompact);
  auto e = parse_completion_request({{"prompt", "x"}, {"structured_outputs", {{"json", schema}, {"disable_any_whitespace", 1}}}},
                                    kLimits, &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_NE(e->message.find("structured_outputs.disable_any_whitespace"), std::string::npos) << e->message;
}

TEST(ApiRequest, CompletionPromptForms) {
  ApiRequest r;
  ASSERT_FALSE(parse_completion_request({{"prompt", {5, 6, 7}}, {"echo", true}, {"logprobs", 2}}, kLimits, &r));
  EXPECT_TRUE(r.prompt_is_ids);
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_TRUE(r.echo);
  EXPECT_EQ(r.logprobs, 2);
  ASSERT_FALSE(parse_completion_request({{"prompt", {{1, 2}}}}, kLimits, &r));
  EXPECT_EQ(r.prompt_ids, (std::vector<int32_t>{1, 2}));
  ASSERT_FALSE(parse_completion_request({{"prompt", {"text"}}}, kLimits, &r));
  EXPECT_EQ(r.prompt_text, "text");
  EXPECT_EQ(completion_error({{"prompt", {"a", "b"}}}).param, "prompt");
  EXPECT_EQ(completion_error({{"prompt", ""}}).param, "prompt");
  EXPECT_EQ(completion_error({{"prompt", {1, -2}}}).param, "prompt");
  EXPECT_EQ(completion_error({{"prompt", 5}}).param, "prompt");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"best_of", 0}}).param, "best_of");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"best_of", "3"}}).param, "best_of");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"n", 0}}).param, "n");
  EXPECT_EQ(completion_error({{"prompt", "x"}, {"suffix", "y"}}).param, "suffix");
  EXPECT_EQ(completion_error(json::object()).param, "prompt");
}

TEST(ApiRequest, ChoicesAndBestOf) {
  ApiRequest r;
  ASSERT_FALSE(parse_chat_request({{"messages", kMsgs}}, kLimits, &r));
  EXPECT_EQ(r.n, 1);
  EXPECT_EQ(r.best_of, 0);
  ASSERT_FALSE(parse_chat_request({{"messages", kMsgs}, {"n", 128}, {"stream", true}}, kLimits, &r));
  EXPECT_EQ(r.n, 128);
  ASSERT_FALSE(parse_completion_request({{"prompt", "x"}, {"n", 2}, {"best_of", 3}}, kLimits, &r));
  EXPECT_EQ(r.n, 2);
  EXPECT_EQ(r.best_of, 3);
  // best_of 1 (or equal to n) ranks nothing, so it may stream.
  ASSERT_FALSE(parse_completion_request({{"prompt", "x"}, {"best_of", 1}, {"stream", true}}, kLimits, &r));
  ApiError e = completion_error({{"prompt", "x"}, {"n", 3}, {"best_of", 2}});
  EXPECT_EQ(e.param, "best_of");
  EXPECT_NE(e.message.find("at least n (3), got 2"), std::string::npos) << e.message;
  e = completion_error({{"prompt", "x"}, {"best_of", 3}, {"stream", true}});
  EXPECT_EQ(e.param, "best_of");
  EXPECT_NE(e.message.find("stream"), std::string::npos) << e.message;
  e = completion_error({{"prompt", "x"}, {"best_of", 129}});
  EXPECT_EQ(e.param, "best_of");
  EXPECT_NE(e.message.find("129"), std::string::npos) << e.message;
}

TEST(ApiRequest, AnthropicMessagesBecomeChatMessages) {
  const json body = {
      {"model", "strata-demo"}, {"max_tokens", 20}, {"system", "You are terse."},
      {"stop_sequences", {"\n\n"}},
      {"tools", {{{"name", "get_weather"}, {"description", "Weather"}, {"input_schema", {{"type", "object"}}}}}},
      {"messages",
       {{{"role", "user"}, {"content", "Weather in Paris?"}},
        {{"role", "assistant"}, {"content", {{{"type", "text"}, {"text", "Checking."}},
                                             {{"type", "tool_use"}, {"id", "toolu_1"}, {"name", "get_weather"}, {"input", {{"city", "Paris"}}}}}}},
        {{"role", "user"}, {"content", {{{"type", "tool_result"}, {"tool_use_id", "toolu_1"}, {"content", "18C"}}}}}}}};
  ApiRequest r;
  ASSERT_FALSE(parse_messages_request(body, kLimits, &r).has_value());
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0]["role"], "system");
  EXPECT_EQ(r.messages[2]["tool_calls"][0]["function"]["arguments"]["city"], "Paris");
  EXPECT_EQ(r.messages[3]["role"], "tool");
  EXPECT_EQ(r.messages[3]["tool_call_id"], "toolu_1");
  EXPECT_EQ(r.tools[0]["function"]["parameters"]["type"], "object");
  EXPECT_EQ(r.stop, std::vector<std::string>{"\n\n"});
  ApiRequest bad;
  auto e = parse_messages_request({{"messages", kMsgs}}, kLimits, &bad);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "max_tokens");
  e = parse_messages_request({{"max_tokens", 5}, {"messages", {{{"role", "user"}, {"content", {{{"type", "image"}}}}}}}}, kLimits, &bad);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages[0].content[0].type");
  EXPECT_EQ(anthropic_error_body(*e)["error"]["type"], "invalid_request_error");
}

TEST(ApiError, ShapesAndUtf8) {
  ApiError e = bad_field("top_p", "top_p must be in (0, 1], got 1.5");
  const json o = openai_error_body(e);
  EXPECT_EQ(o["error"]["param"], "top_p");
  EXPECT_EQ(o["error"]["type"], "invalid_request_error");
  EXPECT_TRUE(o["error"]["code"].is_null());
  EXPECT_FALSE(find_invalid_utf8("plain ascii, é, 日本, 🎉").has_value());
  EXPECT_EQ(find_invalid_utf8("ab\xff"), 2u);
  EXPECT_EQ(find_invalid_utf8("a\xc3"), 1u);          // truncated
  EXPECT_EQ(find_invalid_utf8("\xed\xa0\x80"), 0u);   // a surrogate
  EXPECT_EQ(find_invalid_utf8("\xc0\xaf"), 0u);       // overlong
}

std::string demo_dir() { return std::string(STRATA_SOURCE_DIR) + "/models/strata-demo"; }

ServedModel demo_model() {
  ModelConfig cfg;
  cfg.vocab_size = 4096;
  cfg.default_do_sample = 0;  // generation_config asks for greedy
  auto m = load_served_model(demo_dir(), "strata-demo", cfg, 64);
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.error().to_string());
  return std::move(m).value();
}

TEST(RequestMapping, ChatPromptThroughTheDemoTemplate) {
  ServedModel m = demo_model();
  ApiRequest r;
  ASSERT_FALSE(parse_chat_request({{"messages", kMsgs}, {"max_tokens", 5}}, kLimits, &r));
  PreparedRequest p;
  ASSERT_FALSE(prepare_request(r, m, &p));
  EXPECT_EQ(p.prompt_text, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  auto ids = m.tokenizer.encode(p.prompt_text, false);
  ASSERT_TRUE(ids.ok());
  EXPECT_EQ(p.generation.prompt, *ids);
  EXPECT_EQ(p.generation.prompt[0], 1);  // <|im_start|> as one special token
  EXPECT_EQ(p.generation.max_tokens, 5);
  EXPECT_FLOAT_EQ(p.generation.sampling.temperature, 0.0f);  // generation_config: greedy
}

TEST(RequestMapping, DefaultsAreRequestThenFlagThenGenerationConfig) {
  ApiRequest r;
  SamplingDefaults cli, gen;
  gen.temperature = 0.6f;
  gen.top_p = 0.95f;
  cli.top_p = 0.5f;
  SamplingParams p = resolve_sampling(r, cli, gen);
  EXPECT_FLOAT_EQ(p.temperature, 0.6f);
  EXPECT_FLOAT_EQ(p.top_p, 0.5f);
  r.top_p = 0.9f;
  p = resolve_sampling(r, cli, gen);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 0);
}

TEST(RequestMapping, ContextErrorsNameBothNumbers) {
  ServedModel m = demo_model();
  ApiRequest r;
  ASSERT_FALSE(parse_completion_request({{"prompt", {5, 6, 7, 8}}, {"max_tokens", 61}}, kLimits, &r));
  PreparedRequest p;
  auto e = prepare_request(r, m, &p);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "max_tokens");
  EXPECT_NE(e->message.find("prompt (4 tokens) + max_tokens (61)"), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("64"), std::string::npos);
  ASSERT_FALSE(parse_completion_request({{"prompt", {5, 6, 7, 8}}}, kLimits, &r));
  ASSERT_FALSE(prepare_request(r, m, &p));
  EXPECT_EQ(p.generation.max_tokens, 60);  // the rest of the context
  ASSERT_FALSE(parse_completion_request({{"prompt", {5, 4096}}}, kLimits, &r));
  e = prepare_request(r, m, &p);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt");
  ASSERT_FALSE(parse_completion_request({{"prompt", "x"}, {"top_p", 1.5}}, kLimits, &r));
  e = prepare_request(r, m, &p);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "top_p");
  EXPECT_NE(e->message.find("1.5"), std::string::npos);
  // The demo template does not render tools: refused, not ignored.
  ASSERT_FALSE(parse_chat_request({{"messages", kMsgs}, {"tools", {{{"type", "function"}, {"function", {{"name", "f"}}}}}}}, kLimits, &r));
  e = prepare_request(r, m, &p);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "tools");
}

TEST(RequestMapping, Qwen3ToolsReachTheTemplateAndReasoningIsOn) {
  const std::string dir = tokenizer::testing::reference_dir("qwen3");
  ModelConfig cfg;
  cfg.vocab_size = 151936;
  auto m = load_served_model(dir, "qwen3", cfg, 40960);
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  EXPECT_EQ(m->tool_format, ToolCallFormat::kHermes);
  EXPECT_TRUE(m->reasoning);
  ApiRequest r;
  const json tools = {{{"type", "function"},
                       {"function", {{"name", "get_weather"}, {"description", "Weather of a city"},
                                     {"parameters", {{"type", "object"}, {"properties", {{"city", {{"type", "string"}}}}}}}}}}};
  ASSERT_FALSE(parse_chat_request({{"messages", kMsgs}, {"tools", tools}, {"max_tokens", 4}}, ParseLimits{}, &r));
  PreparedRequest p;
  ASSERT_FALSE(prepare_request(r, *m, &p));
  EXPECT_NE(p.prompt_text.find("<tools>"), std::string::npos);
  EXPECT_NE(p.prompt_text.find("get_weather"), std::string::npos);
  EXPECT_EQ(p.output.tools, ToolCallFormat::kHermes);
  EXPECT_TRUE(p.output.reasoning);
  EXPECT_EQ(p.generation.vocab_limit, m->tokenizer.vocab_size());  // padded rows never sampled

  // What the template writes for an assistant's tool call is what the parser reads back.
  ApiRequest hist;
  ASSERT_FALSE(parse_chat_request(
      {{"messages", {{{"role", "user"}, {"content", "w?"}},
                     {{"role", "assistant"}, {"content", nullptr},
                      {"tool_calls", {{{"id", "c"}, {"type", "function"},
                                       {"function", {{"name", "get_weather"}, {"arguments", "{\"city\": \"Paris\"}"}}}}}}}}},
       {"tools", tools}},
      ParseLimits{}, &hist));
  std::string text;
  ASSERT_FALSE(render_chat_prompt(hist, *m, &text));
  const size_t at = text.find("<|im_start|>assistant\n");  // the history turn, not the generation prompt
  ASSERT_NE(at, std::string::npos);
  std::string turn = text.substr(at + 22);
  turn = turn.substr(0, turn.find("<|im_end|>"));
  const ToolParse parsed = parse_tool_calls(ToolCallFormat::kHermes, turn);
  ASSERT_EQ(parsed.calls.size(), 1u) << turn;
  EXPECT_EQ(parsed.calls[0].name, "get_weather");
  EXPECT_EQ(json::parse(parsed.calls[0].arguments), json({{"city", "Paris"}}));
}

TEST(OutputAssembler, StopStringsAndReasoningOverQwen3Tokens) {
  const tokenizer::Tokenizer& tok = tokenizer::testing::reference_tokenizer("qwen3");
  auto ids = tok.encode("<think>\nhmm\n</think>\n\nThe answer is 42. END and more", false);
  ASSERT_TRUE(ids.ok());
  OutputOptions o;
  o.reasoning = true;
  o.stop = {" END"};
  OutputAssembler a(tok, o);
  std::string content, reasoning;
  size_t n_tokens = 0;
  for (int32_t id : *ids) {
    OutputDelta d = a.push({id}, {});
    content += d.content;
    reasoning += d.reasoning;
    n_tokens += d.tokens.size();
    if (a.stopped()) break;
  }
  EXPECT_TRUE(a.stopped());
  std::vector<ToolCall> calls;
  OutputDelta last = a.finish(&calls);
  content += last.content;
  n_tokens += last.tokens.size();
  EXPECT_EQ(reasoning, "hmm");
  EXPECT_EQ(content, "The answer is 42.");
  EXPECT_GT(n_tokens, 0u);
}

TEST(ResponseBuilder, ChatStreamAndBody) {
  const tokenizer::Tokenizer& tok = tokenizer::testing::reference_tokenizer("qwen3");
  ResponseContext c;
  c.id = "chatcmpl-1";
  c.model = "m";
  c.include_usage = true;
  auto b = make_response_builder(ApiKind::kChat, c, tok);
  std::string sse = b->start();
  OutputDelta d;
  d.content = "Hel";
  sse += b->delta(d);
  d.content = "lo";
  FinishState f;
  f.reason = FinishReason::kLength;
  f.usage = {5, 2, 0};
  sse += b->finish(d, {}, f);
  // Every event is one `data: ` line and a blank line; the stream ends with [DONE].
  std::vector<json> chunks;
  size_t pos = 0;
  while (pos < sse.size()) {
    const size_t end = sse.find("\n\n", pos);
    ASSERT_NE(end, std::string::npos);
    const std::string ev = sse.substr(pos, end - pos);
    ASSERT_EQ(ev.rfind("data: ", 0), 0u) << ev;
    if (ev != "data: [DONE]") chunks.push_back(json::parse(ev.substr(6)));
    pos = end + 2;
  }
  ASSERT_EQ(sse.substr(sse.size() - 14), "data: [DONE]\n\n");
  ASSERT_GE(chunks.size(), 4u);
  EXPECT_EQ(chunks[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(chunks[1]["choices"][0]["delta"]["content"], "Hel");
  EXPECT_TRUE(chunks[1]["usage"].is_null());
  EXPECT_EQ(chunks[chunks.size() - 2]["choices"][0]["finish_reason"], "length");
  EXPECT_TRUE(chunks.back()["choices"].empty());
  EXPECT_EQ(chunks.back()["usage"]["total_tokens"], 7);
  const json body = b->body();
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["choices"][0]["message"]["content"], "Hello");
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

// n > 1: each choice's builder writes its index and leaves the usage chunk and [DONE] to the
// shared end; the body merges the choices, counting the prompt once.
TEST(ResponseBuilder, ChoicesShareOneStreamAndOneBody) {
  const tokenizer::Tokenizer& tok = tokenizer::testing::reference_tokenizer("qwen3");
  for (ApiKind kind : {ApiKind::kChat, ApiKind::kCompletion}) {
    std::vector<std::unique_ptr<ResponseBuilder>> builders;
    std::vector<Usage> usages;
    std::string sse;
    for (int i = 0; i < 3; ++i) {
      ResponseContext c;
      c.id = "x-1";
      c.include_usage = true;
      c.choice_index = i;
      c.shared_stream = true;
      builders.push_back(make_response_builder(kind, c, tok));
      sse += builders.back()->start();
    }
    for (int i = 0; i < 3; ++i) {
      OutputDelta d;
      d.content = "choice" + std::to_string(i);
      FinishState f;
      f.reason = i == 1 ? FinishReason::kLength : FinishReason::kStop;
      f.usage = {10, 2 + i, 8};
      usages.push_back(f.usage);
      const std::string text = builders[size_t(i)]->finish(d, {}, f);
      EXPECT_EQ(text.find("[DONE]"), std::string::npos);
      sse += text;
    }
    const Usage total = sum_choice_usage(usages);
    EXPECT_EQ(total.prompt_tokens, 10);
    EXPECT_EQ(total.cached_tokens, 8);
    EXPECT_EQ(total.completion_tokens, 2 + 3 + 4);
    sse += builders[0]->stream_end(total);
    ASSERT_EQ(sse.substr(sse.size() - 14), "data: [DONE]\n\n");
    std::vector<int> finishes(3, 0);
    json usage_chunk;
    size_t pos = 0;
    while (pos < sse.size()) {
      const size_t end = sse.find("\n\n", pos);
      ASSERT_NE(end, std::string::npos);
      const std::string ev = sse.substr(pos, end - pos);
      pos = end + 2;
      if (ev == "data: [DONE]") continue;
      const json j = json::parse(ev.substr(6));
      if (j["choices"].empty()) {
        usage_chunk = j;
        continue;
      }
      const json& c = j["choices"][0];
      if (!c["finish_reason"].is_null()) ++finishes[size_t(c["index"].get<int>())];
    }
    EXPECT_EQ(finishes, (std::vector<int>{1, 1, 1}));
    EXPECT_EQ(usage_chunk["usage"]["completion_tokens"], 9);
    EXPECT_EQ(usage_chunk["usage"]["prompt_tokens"], 10);

    std::vector<json> bodies;
    for (auto& b : builders) bodies.push_back(b->body());
    // best_of: candidates 2 and 0 in that order become choices 0 and 1.
    const std::vector<size_t> best = best_candidates({-3.0, -7.5, -1.25}, 2);
    EXPECT_EQ(best, (std::vector<size_t>{2, 0}));
    EXPECT_EQ(best_candidates({-1.0, -1.0, -2.0}, 3), (std::vector<size_t>{0, 1, 2}));
    const json body = merge_choice_bodies({bodies[best[0]], bodies[best[1]]}, total);
    ASSERT_EQ(body["choices"].size(), 2u);
    EXPECT_EQ(body["choices"][0]["index"], 0);
    EXPECT_EQ(body["choices"][1]["index"], 1);
    const char* text_key = kind == ApiKind::kChat ? "message" : "text";
    const json& c0 = body["choices"][0][text_key];
    EXPECT_EQ(kind == ApiKind::kChat ? c0["content"] : c0, "choice2");
    EXPECT_EQ(body["usage"]["completion_tokens"], 9);
    EXPECT_EQ(body["usage"]["total_tokens"], 19);
    EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 8);
  }
}

// return_tokens_as_token_ids (vLLM's field): logprob entries name tokens "token_id:N", in the
// chat and completion shapes alike; the completion's text offsets still count the text.
TEST(ResponseBuilder, TokensAsTokenIds) {
  ApiRequest r;
  ASSERT_FALSE(parse_chat_request({{"messages", kMsgs}, {"logprobs", true}, {"return_tokens_as_token_ids", true}}, kLimits, &r));
  EXPECT_TRUE(r.tokens_as_ids);
  ASSERT_FALSE(parse_chat_request({{"messages", kMsgs}}, kLimits, &r));
  EXPECT_FALSE(r.tokens_as_ids);
  ApiError e = chat_error({{"messages", kMsgs}, {"return_tokens_as_token_ids", "yes"}});
  EXPECT_EQ(e.param, "return_tokens_as_token_ids");
  ASSERT_FALSE(parse_completion_request({{"prompt", "a"}, {"logprobs", 1}, {"return_tokens_as_token_ids", true}}, kLimits, &r));
  EXPECT_TRUE(r.tokens_as_ids);

  const tokenizer::Tokenizer& tok = tokenizer::testing::reference_tokenizer("qwen3");
  const int32_t a = 9707, b = 1879, alt = 13;
  const std::string ta = tok.decode(&a, 1, false), tb = tok.decode(&b, 1, false);
  ASSERT_FALSE(ta.empty());
  OutputDelta d;
  d.content = ta + tb;
  d.tokens = {a, b};
  d.logprobs = {{{a, -0.5f}, {{a, -0.5f}, {alt, -1.5f}}}, {{b, -0.25f}, {{b, -0.25f}, {alt, -2.0f}}}};
  FinishState f;
  f.usage = {1, 2, 0};
  for (bool as_ids : {false, true}) {
    ResponseContext c;
    c.id = "chatcmpl-1";
    c.logprobs = 1;
    c.tokens_as_ids = as_ids;
    auto chat = make_response_builder(ApiKind::kChat, c, tok);
    chat->start();
    chat->finish(d, {}, f);
    const json content = chat->body()["choices"][0]["logprobs"]["content"];
    ASSERT_EQ(content.size(), 2u);
    EXPECT_EQ(content[0]["token"], as_ids ? "token_id:9707" : ta);
    EXPECT_EQ(content[1]["token"], as_ids ? "token_id:1879" : tb);
    EXPECT_EQ(content[0]["top_logprobs"][1]["token"], as_ids ? "token_id:13" : tok.decode(&alt, 1, false));
    EXPECT_FLOAT_EQ(content[1]["logprob"].get<float>(), -0.25f);

    c.id = "cmpl-1";
    auto cmpl = make_response_builder(ApiKind::kCompletion, c, tok);
    cmpl->start();
    cmpl->finish(d, {}, f);
    const json lp = cmpl->body()["choices"][0]["logprobs"];
    ASSERT_EQ(lp["tokens"].size(), 2u);
    EXPECT_EQ(lp["tokens"][0], as_ids ? "token_id:9707" : ta);
    EXPECT_EQ(lp["text_offset"][1], int64_t(ta.size()));
    EXPECT_TRUE(lp["top_logprobs"][0].contains(as_ids ? "token_id:13" : tok.decode(&alt, 1, false)));
  }
}

TEST(ResponseBuilder, ToolCallsAndAnthropicEvents) {
  const tokenizer::Tokenizer& tok = tokenizer::testing::reference_tokenizer("qwen3");
  auto b = make_response_builder(ApiKind::kChat, ResponseContext{}, tok);
  FinishState f;
  f.usage = {3, 9, 0};
  b->finish(OutputDelta{}, {{"get_weather", "{\"city\":\"Paris\"}"}}, f);
  json body = b->body();
  EXPECT_EQ(body["choices"][0]["finish_reason"], "tool_calls");
  EXPECT_TRUE(body["choices"][0]["message"]["content"].is_null());
  EXPECT_EQ(body["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(body["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"], "{\"city\":\"Paris\"}");

  ResponseContext c;
  c.id = "msg_1";
  c.model = "m";
  c.prompt_ids = {1, 2, 3};
  auto a = make_response_builder(ApiKind::kMessages, c, tok);
  std::string sse = a->start();
  OutputDelta d;
  d.reasoning = "think";
  sse += a->delta(d);
  d = OutputDelta{};
  d.content = "Hi";
  f.stop_string = true;
  f.stop_sequence = "\n";
  f.reason = FinishReason::kCancelled;
  sse += a->finish(d, {}, f);
  std::vector<std::string> events;
  for (size_t p = sse.find("event: "); p != std::string::npos; p = sse.find("event: ", p + 1)) {
    events.push_back(sse.substr(p + 7, sse.find('\n', p) - p - 7));
  }
  const std::vector<std::string> want = {"message_start", "ping", "content_block_start", "content_block_delta",
                                         "content_block_stop", "content_block_start", "content_block_delta",
                                         "content_block_stop", "message_delta", "message_stop"};
  EXPECT_EQ(events, want);
  body = a->body();
  EXPECT_EQ(body["stop_reason"], "stop_sequence");
  EXPECT_EQ(body["stop_sequence"], "\n");
  EXPECT_EQ(body["content"][0]["type"], "thinking");
  EXPECT_EQ(body["content"][1]["text"], "Hi");
}

TEST(Metrics, PrometheusText) {
  ServerMetrics m;
  m.count_request("/v1/completions", 200);
  m.count_request("/v1/completions", 400);
  m.count_usage({10, 5, 8});
  EngineStats e;
  e.alive = true;
  e.kv.used = 3;
  e.kv.free = 7;
  e.ttft.add(12.0);
  e.checkpoints_foreign = 2;
  ServerMetrics::Snapshot snap = m.snapshot();
  snap.rejected_connections = 4;
  const std::string t = render_metrics(snap, e, "demo");
  EXPECT_NE(t.find("strata_http_rejected_connections_total{model_name=\"demo\"} 4"), std::string::npos) << t;
  EXPECT_NE(t.find("strata_checkpoints_foreign_total{model_name=\"demo\"} 2"), std::string::npos) << t;
  EXPECT_NE(t.find("strata_requests_total{model_name=\"demo\",endpoint=\"/v1/completions\",status=\"400\"} 1"), std::string::npos) << t;
  EXPECT_NE(t.find("strata_kv_blocks{model_name=\"demo\",state=\"used\"} 3"), std::string::npos);
  EXPECT_NE(t.find("strata_prefix_cache_hit_rate{model_name=\"demo\"} 0.8"), std::string::npos);
  EXPECT_NE(t.find("strata_time_to_first_token_seconds_count{model_name=\"demo\"} 1"), std::string::npos);
  EXPECT_NE(t.find("# TYPE strata_time_to_first_token_seconds histogram"), std::string::npos);
}

}  // namespace
}  // namespace strata::server
