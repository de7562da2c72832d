// Per-request traces: which X-Request-Id values are taken, the "strata" option's errors, and the
// times and token counts from a request's stream events.
#include <gtest/gtest.h>

#include "server/request_trace.h"

namespace strata::server {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

TEST(RequestTrace, AcceptsSaneIdsAndReplacesOthers) {
  EXPECT_EQ(accept_request_id("abc-123_X.y:z"), "abc-123_X.y:z");
  for (const std::string& bad : std::vector<std::string>{"", "has space", "quote\"", "new\nline", std::string(129, 'a'), "caf\xc3\xa9"}) {
    const std::string id = accept_request_id(bad);
    EXPECT_NE(id, bad);
    EXPECT_EQ(id.rfind("req_", 0), 0u) << id;
    EXPECT_EQ(id.size(), 28u);
  }
  EXPECT_NE(accept_request_id(""), accept_request_id(""));
}

TEST(RequestTrace, OptionErrorsNameTheField) {
  bool trace = true;
  EXPECT_FALSE(parse_trace_option(json::object(), &trace));
  EXPECT_FALSE(trace);
  EXPECT_FALSE(parse_trace_option({{"strata", {{"trace", true}}}}, &trace));
  EXPECT_TRUE(trace);
  auto e = parse_trace_option({{"strata", "yes"}}, &trace);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "strata");
  EXPECT_NE(e->message.find("\"yes\""), std::string::npos);
  e = parse_trace_option({{"strata", {{"trace", 1}}}}, &trace);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "strata.trace");
  EXPECT_NE(e->message.find("number 1"), std::string::npos);
}

TEST(RequestTrace, TimesAndTokensFromTheStream) {
  const auto t0 = RequestTrace::Clock::now();
  RequestTrace t("r1", t0);
  t.submitted(t0 + milliseconds(2));
  StreamEvent tokens;
  tokens.tokens = {5, 6};
  t.on_event(tokens, t0 + milliseconds(12));
  tokens.tokens = {7};
  t.on_event(tokens, t0 + milliseconds(15));
  StreamEvent end;
  end.final = true;
  end.usage = {40, 3, 32};
  end.queued_ms = 4.0;  // the engine scheduled it 4 ms after submit: 6 ms of prefill to the first token
  end.preemptions = 1;
  t.on_event(end, t0 + milliseconds(20));
  const json j = t.to_json();
  EXPECT_EQ(j["request_id"], "r1");
  EXPECT_DOUBLE_EQ(j["prepare_ms"].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["queued_prefill_ms"].get<double>(), 10.0);
  EXPECT_DOUBLE_EQ(j["queued_ms"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(j["prefill_ms"].get<double>(), 6.0);
  EXPECT_EQ(j["preemptions"], 1);
  EXPECT_DOUBLE_EQ(j["decode_ms"].get<double>(), 8.0);
  EXPECT_DOUBLE_EQ(j["total_ms"].get<double>(), 20.0);
  EXPECT_EQ(j["cached_tokens"], 32);
  EXPECT_EQ(j["computed_tokens"], 8);
  EXPECT_EQ(j["generated_tokens"], 3);
  EXPECT_EQ(j["token_events"], 2);
  EXPECT_EQ(t.log_line("POST", "/v1/chat/completions", 200, "stop"),
            "request id=r1 method=POST path=/v1/chat/completions status=200 finish=stop prompt_tokens=40 cached_tokens=32 "
            "computed_tokens=8 generated_tokens=3 prepare_ms=2.0 queued_ms=4.0 prefill_ms=6.0 queued_prefill_ms=10.0 decode_ms=8.0 total_ms=20.0 "
            "preemptions=1");

  // Ended by its first sampled token (EOS): no token event, decoding took no time.
  RequestTrace eos("r2", t0);
  eos.submitted(t0);
  eos.on_event(end, t0 + milliseconds(5));
  EXPECT_DOUBLE_EQ(eos.to_json()["queued_prefill_ms"].get<double>(), 5.0);
  EXPECT_DOUBLE_EQ(eos.to_json()["decode_ms"].get<double>(), 0.0);
  EXPECT_DOUBLE_EQ(eos.to_json()["queued_ms"].get<double>(), 4.0);
  EXPECT_DOUBLE_EQ(eos.to_json()["prefill_ms"].get<double>(), 1.0);
}

TEST(RequestTrace, QueuedSplitIsClampedToTheFirstToken) {
  // The engine's clock starts inside submit(), before the server's: a queue longer than the
  // server saw counts whole as queued, with no prefill left over.
  const auto t0 = RequestTrace::Clock::now();
  RequestTrace t("r3", t0);
  t.submitted(t0);
  StreamEvent end;
  end.final = true;
  end.queued_ms = 7.5;
  t.on_event(end, t0 + milliseconds(7));
  const json j = t.to_json();
  EXPECT_DOUBLE_EQ(j["queued_ms"].get<double>(), 7.0);
  EXPECT_DOUBLE_EQ(j["prefill_ms"].get<double>(), 0.0);
  EXPECT_EQ(j["preemptions"], 0);
}

}  // namespace
}  // namespace strata::server
