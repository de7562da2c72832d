// reasoning_effort (chat) and reasoning.effort (Responses): validated, passed to the chat
// template as reasoning_effort, and "none"/"minimal" turning enable_thinking off where the
// request does not set it.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "server/api_request.h"
#include "server/request_mapping.h"
#include "server/responses_api.h"
#include "tokenizer_test_util.h"

namespace strata::server {
namespace {

using json = nlohmann::json;

const json kMsgs = json::array({{{"role", "user"}, {"content", "hi"}}});

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(ReasoningEffort, ChatFieldIsValidated) {
  ApiRequest r;
  ASSERT_FALSE(parse_chat_request({{"messages", kMsgs}, {"reasoning_effort", "low"}}, ParseLimits{}, &r));
  EXPECT_EQ(r.reasoning_effort, "low");
  for (const char* e : kReasoningEfforts) {
    ASSERT_FALSE(parse_chat_request({{"messages", kMsgs}, {"reasoning_effort", e}}, ParseLimits{}, &r)) << e;
    EXPECT_EQ(r.reasoning_effort, e);
  }
  ASSERT_FALSE(parse_chat_request({{"messages", kMsgs}, {"reasoning_effort", nullptr}}, ParseLimits{}, &r));
  EXPECT_EQ(r.reasoning_effort, "");
  auto e = parse_chat_request({{"messages", kMsgs}, {"reasoning_effort", "extreme"}}, ParseLimits{}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->param, "reasoning_effort");
  EXPECT_NE(e->message.find("got \"extreme\""), std::string::npos) << e->message;
  EXPECT_NE(e->message.find("'high'"), std::string::npos) << e->message;
  e = parse_chat_request({{"messages", kMsgs}, {"reasoning_effort", 3}}, ParseLimits{}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "reasoning_effort");
  EXPECT_NE(e->message.find("3"), std::string::npos) << e->message;
}

TEST(ReasoningEffort, ResponsesFieldReachesTheRequest) {
  ResponsesRequest r;
  ASSERT_FALSE(parse_responses_request({{"input", "hi"}, {"reasoning", {{"effort", "high"}}}}, ParseLimits{}, &r));
  EXPECT_EQ(r.api.reasoning_effort, "high");
  EXPECT_EQ(r.echo["reasoning"]["effort"], "high");
  auto e = parse_responses_request({{"input", "hi"}, {"reasoning", {{"effort", "max"}}}}, ParseLimits{}, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "reasoning.effort");
  EXPECT_NE(e->message.find("got \"max\""), std::string::npos) << e->message;
}

// gpt-oss's template prints the effort into its system message, "medium" when none is given.
TEST(ReasoningEffort, GptOssTemplatePrintsIt) {
  ModelConfig cfg;
  cfg.vocab_size = 4096;
  auto m = load_served_model(std::string(STRATA_SOURCE_DIR) + "/models/strata-demo", "gptoss", cfg, 4096);
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  auto t = tokenizer::ChatTemplate::parse(read_file(std::string(STRATA_TEST_DATA) + "/chat_templates/gptoss_excerpt.jinja"));
  ASSERT_TRUE(t.ok()) << t.error().message;
  m->chat_template = std::move(t).value();
  auto render = [&](const json& body) {
    ApiRequest r;
    EXPECT_FALSE(parse_chat_request(body, ParseLimits{}, &r));
    std::string text;
    EXPECT_FALSE(render_chat_prompt(r, *m, &text));
    return text;
  };
  std::string text = render({{"messages", kMsgs}});
  EXPECT_NE(text.find("\n\nReasoning: medium\n\n# Valid channels"), std::string::npos) << text;
  text = render({{"messages", kMsgs}, {"reasoning_effort", "high"}});
  EXPECT_NE(text.find("\n\nReasoning: high\n\n# Valid channels"), std::string::npos) << text;
  const std::string tail = "<|end|><|start|>user<|message|>hi<|end|><|start|>assistant";
  EXPECT_EQ(text.substr(text.size() - tail.size()), tail);
  text = render({{"messages", kMsgs}, {"reasoning_effort", "low"}, {"chat_template_kwargs", {{"reasoning_effort", "high"}}}});
  EXPECT_NE(text.find("Reasoning: low\n"), std::string::npos) << "the request's own field wins";
}

// Qwen3's template closes an empty <think></think> when enable_thinking is false.
TEST(ReasoningEffort, NoneTurnsQwen3ThinkingOffUnlessKwargsSayOtherwise) {
  ModelConfig cfg;
  cfg.vocab_size = 151936;
  auto m = load_served_model(tokenizer::testing::reference_dir("qwen3"), "qwen3", cfg, 40960);
  ASSERT_TRUE(m.ok()) << m.error().to_string();
  const std::string off = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
  auto render = [&](const json& body) {
    ApiRequest r;
    EXPECT_FALSE(parse_chat_request(body, ParseLimits{}, &r));
    PreparedRequest p;
    EXPECT_FALSE(prepare_request(r, *m, &p));
    return p.prompt_text;
  };
  auto ends_with = [](const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
  };
  EXPECT_FALSE(ends_with(render({{"messages", kMsgs}}), off));
  EXPECT_TRUE(ends_with(render({{"messages", kMsgs}, {"reasoning_effort", "none"}}), off));
  EXPECT_TRUE(ends_with(render({{"messages", kMsgs}, {"reasoning_effort", "minimal"}}), off));
  EXPECT_FALSE(ends_with(render({{"messages", kMsgs}, {"reasoning_effort", "high"}}), off));
  EXPECT_FALSE(ends_with(render({{"messages", kMsgs}, {"reasoning_effort", "none"},
                                 {"chat_template_kwargs", {{"enable_thinking", true}}}}),
                         off));
  EXPECT_TRUE(ends_with(render({{"messages", kMsgs}, {"chat_template_kwargs", {{"enable_thinking", false}}}}), off));
}

}  // namespace
}  // namespace strata::server
