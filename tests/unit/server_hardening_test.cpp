// What clients send that once crashed, starved or misled the server: JSON nested past the
// limit or holding numbers no double holds (json_guard.h), request heads the listener screens
// (http_listener.h), API keys, temperature ranges, and the token count after a stop string.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "server/api_error.h"
#include "server/api_request.h"
#include "server/http_listener.h"
#include "server/json_guard.h"
#include "server/output_assembler.h"
#include "tokenizer_test_util.h"

namespace strata::server {
namespace {

using json = nlohmann::json;

std::string nested(int depth, const std::string& open = "[", const std::string& close = "]") {
  std::string s;
  for (int i = 0; i < depth; ++i) s += open;
  for (int i = 0; i < depth; ++i) s += close;
  return s;
}

TEST(JsonGuard, DepthAtTheLimitPassesOneMoreNamesTheBody) {
  EXPECT_FALSE(check_json_text(nested(256), 256).has_value());
  auto e = check_json_text(nested(257), 256);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->param, "body");
  EXPECT_NE(e->message.find("deeper than 256 levels"), std::string::npos) << e->message;
  // 100,000 levels: refused without recursion (this test would overflow the stack otherwise).
  auto deep = check_json_text(nested(100000), 256);
  ASSERT_TRUE(deep.has_value());
  EXPECT_EQ(deep->param, "body");
}

TEST(JsonGuard, NamesTheTopLevelFieldAndThePath) {
  const std::string body = R"({"model":"m","tools":[{"type":"function","function":{"name":"f","parameters":)" +
                           nested(300, "{\"a\":", "}") + "}}]}";
  // nested(300, "{\"a\":", "}") is not valid JSON at its innermost point; depth is found first.
  auto e = check_json_text(body, 256);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "tools");
  EXPECT_NE(e->message.find("tools[0].function.parameters"), std::string::npos) << e->message;

  const std::string msgs = R"({"messages":[{"role":"user","content":)" + nested(1000) + "}]}";
  auto m = check_json_text(msgs, 256);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->param, "messages");
  EXPECT_NE(m->message.find("messages[0].content[0]"), std::string::npos) << m->message;

  const std::string mt = R"({"messages":[],"max_tokens":)" + nested(5000) + "}";
  auto t = check_json_text(mt, 256);
  ASSERT_TRUE(t.has_value());
  EXPECT_EQ(t->param, "max_tokens");
}

TEST(JsonGuard, BracketsInStringsAndEscapedQuotesDoNotCount) {
  const std::string s = R"({"content":")" + nested(1000) + R"(\"[[[[","x":[1,2,{"y":"}}}]]]"}]})";
  EXPECT_FALSE(check_json_text(s, 4).has_value());
  // Depth 4 exactly: {"x":[{"y":[1]}]} has an object, array, object, array.
  EXPECT_FALSE(check_json_text(R"({"x":[{"y":[1]}]})", 4).has_value());
  EXPECT_TRUE(check_json_text(R"({"x":[{"y":[[1]]}]})", 4).has_value());
}

TEST(JsonGuard, NumbersPastADoubleNameTheirField) {
  auto e = check_json_text(R"({"messages":[],"temperature":1e400})", 256);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "temperature");
  EXPECT_NE(e->message.find("1e400"), std::string::npos) << e->message;
  auto neg = check_json_text(R"({"logit_bias":{"5":-2.5E+999}})", 256);
  ASSERT_TRUE(neg.has_value());
  EXPECT_EQ(neg->param, "logit_bias");
  // In range, tiny (underflows to 0), and integers past 64 bits (nlohmann keeps them as doubles).
  EXPECT_FALSE(check_json_text(R"({"a":1.7e308,"b":1e-400,"c":123456789012345678901234567890})", 256).has_value());
  // Inside a string it is text.
  EXPECT_FALSE(check_json_text(R"({"a":"1e400"})", 256).has_value());
  // And a body that passes parses: nlohmann would have thrown out_of_range on 1e400.
  EXPECT_TRUE(parse_json_bounded(R"({"a":1e308})", 256).has_value());
  ApiError err;
  EXPECT_FALSE(parse_json_bounded(R"({"a":1e400})", 256, &err).has_value());
  EXPECT_EQ(err.param, "a");
}

TEST(JsonGuard, ToolCallArgumentStringsAreBoundedToo) {
  const json body = {{"messages",
                      {{{"role", "user"}, {"content", "hi"}},
                       {{"role", "assistant"},
                        {"tool_calls",
                         {{{"id", "c"}, {"type", "function"}, {"function", {{"name", "f"}, {"arguments", nested(100000)}}}}}}}}}};
  ApiRequest r;
  ParseLimits limits{{}, 256};
  auto e = parse_chat_request(body, limits, &r);
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->param, "messages[1].tool_calls[0].function.arguments");
  EXPECT_NE(e->message.find("deeper than 256"), std::string::npos) << e->message;
}

TEST(ApiRequestRanges, TemperatureRangesAndAnthropicMetadata) {
  const json msgs = json::array({{{"role", "user"}, {"content", "hi"}}});
  ParseLimits limits;
  ApiRequest r;
  EXPECT_FALSE(parse_chat_request({{"messages", msgs}, {"temperature", 2.0}}, limits, &r).has_value());
  auto hot = parse_chat_request({{"messages", msgs}, {"temperature", 3.0}}, limits, &r);
  ASSERT_TRUE(hot.has_value());
  EXPECT_EQ(hot->param, "temperature");
  EXPECT_NE(hot->message.find("[0, 2]"), std::string::npos) << hot->message;
  EXPECT_TRUE(parse_completion_request({{"prompt", "x"}, {"temperature", -0.1}}, limits, &r).has_value());

  const json anthropic = {{"messages", msgs}, {"max_tokens", 4}};
  json ok = anthropic;
  ok["temperature"] = 1.0;
  EXPECT_FALSE(parse_messages_request(ok, limits, &r).has_value());
  json warm = anthropic;
  warm["temperature"] = 1.5;
  auto w = parse_messages_request(warm, limits, &r);
  ASSERT_TRUE(w.has_value());
  EXPECT_NE(w->message.find("[0, 1]"), std::string::npos) << w->message;
  json md = anthropic;
  md["metadata"] = "string";
  auto m = parse_messages_request(md, limits, &r);
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->param, "metadata");
  md["metadata"] = {{"user_id", "u1"}};
  ASSERT_FALSE(parse_messages_request(md, limits, &r).has_value());
  EXPECT_EQ(r.user, "u1");
}

TEST(ApiKey, BearerSchemeIsCaseInsensitive) {
  EXPECT_FALSE(check_api_key("k3y", "Bearer k3y", "").has_value());
  EXPECT_FALSE(check_api_key("k3y", "bearer k3y", "").has_value());
  EXPECT_FALSE(check_api_key("k3y", "BEARER   k3y ", "").has_value());
  EXPECT_FALSE(check_api_key("k3y", "", "k3y").has_value());
  EXPECT_TRUE(check_api_key("k3y", "Bearer k3", "").has_value());
  EXPECT_TRUE(check_api_key("k3y", "Basic k3y", "").has_value());
  EXPECT_TRUE(check_api_key("k3y", "Bearerk3y", "").has_value());
  EXPECT_TRUE(check_api_key("k3y", "", "").has_value());
  EXPECT_FALSE(check_api_key("", "", "").has_value());
  EXPECT_TRUE(secrets_equal("abc", "abc"));
  EXPECT_FALSE(secrets_equal("abc", "abd"));
  EXPECT_FALSE(secrets_equal("abc", "abcd"));
}

const std::string kHead = "POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\n";

TEST(RequestHead, WaitsForTheHeadAndAShortBody) {
  ListenerLimits l;
  l.max_body_bytes = 1000;
  EXPECT_EQ(check_request_head("POST /v1/chat/completions HTTP/1.1\r\nHost:", l, 64).kind, HeadCheck::kWait);
  const HeadCheck partial = check_request_head(kHead + "Content-Length: 10\r\n\r\n12345", l, 64);
  EXPECT_EQ(partial.kind, HeadCheck::kWait);
  EXPECT_EQ(partial.path, "/v1/chat/completions");
  EXPECT_EQ(check_request_head(kHead + "Content-Length: 10\r\n\r\n1234567890", l, 64).kind, HeadCheck::kReady);
  // A long body: its first body_gate bytes are enough.
  EXPECT_EQ(check_request_head(kHead + "Content-Length: 900\r\n\r\n" + std::string(64, 'x'), l, 64).kind, HeadCheck::kReady);
  EXPECT_EQ(check_request_head(kHead + "Content-Length: 900\r\n\r\n" + std::string(63, 'x'), l, 64).kind, HeadCheck::kWait);
  EXPECT_EQ(check_request_head("GET /health HTTP/1.1\r\nHost: h\r\n\r\n", l, 64).kind, HeadCheck::kReady);
  EXPECT_EQ(check_request_head(kHead + "Transfer-Encoding: chunked\r\n\r\n", l, 64).kind, HeadCheck::kReady);
  EXPECT_EQ(check_request_head(kHead + "Content-Length: 900\r\nExpect: 100-continue\r\n\r\n", l, 64).kind, HeadCheck::kReady);
}

TEST(RequestHead, RefusesAbsurdLengthsAndHugeHeadsAtOnce) {
  ListenerLimits l;
  l.max_body_bytes = 1000;
  l.max_header_bytes = 256;
  const HeadCheck big = check_request_head(kHead + "Content-Length: 1001\r\n\r\n", l, 64);
  EXPECT_EQ(big.kind, HeadCheck::kReject);
  EXPECT_EQ(big.status, 413);
  const HeadCheck absurd = check_request_head(kHead + "Content-Length: 99999999999999999999999\r\n\r\n", l, 64);
  EXPECT_EQ(absurd.kind, HeadCheck::kReject);
  EXPECT_EQ(absurd.status, 413);
  for (const char* bad : {"-1", "abc", "1e3", "", "12 34"}) {
    const HeadCheck h = check_request_head(kHead + "Content-Length: " + bad + "\r\n\r\n", l, 64);
    EXPECT_EQ(h.kind, HeadCheck::kReject) << bad;
    EXPECT_EQ(h.status, 400) << bad;
    EXPECT_NE(h.message.find("Content-Length"), std::string::npos) << h.message;
  }
  const HeadCheck twice = check_request_head(kHead + "Content-Length: 3\r\ncontent-length: 4\r\n\r\nabcd", l, 64);
  EXPECT_EQ(twice.status, 400);
  // A head that never ends past the limit, and one that ends past it.
  const HeadCheck endless = check_request_head(kHead + "X-Pad: " + std::string(300, 'a'), l, 64);
  EXPECT_EQ(endless.kind, HeadCheck::kReject);
  EXPECT_EQ(endless.status, 431);
  const HeadCheck huge = check_request_head(kHead + "X-Pad: " + std::string(300, 'a') + "\r\n\r\n", l, 64);
  EXPECT_EQ(huge.status, 431);
}

// The engine samples on until it sees the cancel a stop string sends: tokens past the one that
// completed the stop string must not count (they arrived in the same event here).
TEST(OutputAssembler, TokensAfterAStopStringDoNotCount) {
  const tokenizer::Tokenizer& tok = tokenizer::testing::reference_tokenizer("qwen3");
  auto ids = tok.encode("The answer is 42. END and then much more text", false);
  ASSERT_TRUE(ids.ok());
  auto head = tok.encode("The answer is 42. END", false);
  ASSERT_TRUE(head.ok());
  ASSERT_LT(head->size(), ids->size());
  for (size_t split : {size_t(1), ids->size()}) {  // token by token, and all in one event
    OutputOptions o;
    o.stop = {" END"};
    OutputAssembler a(tok, o);
    std::string content;
    size_t counted = 0;
    for (size_t i = 0; i < ids->size(); i += split) {
      std::vector<int32_t> part(ids->begin() + long(i), ids->begin() + long(std::min(ids->size(), i + split)));
      std::vector<TokenLogprobs> lps(part.size());
      OutputDelta d = a.push(part, lps);
      content += d.content;
      counted += d.tokens.size();
      EXPECT_EQ(d.tokens.size(), d.logprobs.size());
    }
    std::vector<ToolCall> calls;
    OutputDelta last = a.finish(&calls);
    content += last.content;
    counted += last.tokens.size();
    EXPECT_TRUE(a.stopped());
    EXPECT_EQ(a.stop_sequence(), " END");
    EXPECT_EQ(content, "The answer is 42.");
    EXPECT_EQ(size_t(a.n_tokens()), head->size()) << "split " << split;
    EXPECT_EQ(counted, head->size()) << "split " << split;
  }
}

}  // namespace
}  // namespace strata::server
