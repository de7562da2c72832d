// The router's routing key and the filter that continues a resumed stream without repeats.
#include <set>

#include <gtest/gtest.h>

#include "router/router.h"

namespace strata::router {
namespace {

std::string chunk(const std::string& content) {
  return "data: {\"choices\":[{\"delta\":{\"content\":\"" + content + "\"},\"finish_reason\":null,\"index\":0}]}\n\n";
}

TEST(RouteKey, AConversationKeepsItsKeyAsItGrows) {
  const std::string turn1 = R"({"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"}]})";
  const std::string turn2 = R"({"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"q1"},)"
                            R"({"role":"assistant","content":"a1"},{"role":"user","content":"q2"}]})";
  EXPECT_EQ(route_key(turn1, "", 512).prefix, route_key(turn2, "", 512).prefix);
  EXPECT_NE(route_key(turn1, "", 512).prefix,
            route_key(R"({"model":"m","messages":[{"role":"system","content":"S"},{"role":"user","content":"other"}]})", "", 512).prefix);
  EXPECT_EQ(route_key(R"({"prompt":"abcdefgh"})", "", 4).prefix.size(), 4u);
  EXPECT_EQ(route_key(R"({"session_id":"s1","prompt":"x"})", "", 512).session, "s1");
  EXPECT_EQ(route_key(R"({"session_id":"s1","prompt":"x"})", "hdr", 512).session, "hdr");
  EXPECT_TRUE(route_key("not json", "", 512).prefix.empty());
}

TEST(ResumeFilter, SkipsTheReplayedTextAndCutsTheChunkThatStraddlesIt) {
  ResumeFilter first(0, false);
  std::string out = first.feed(chunk("Hel").data(), chunk("Hel").size());
  out += first.feed(chunk("lo").data(), 3);  // a partial event waits for its end
  EXPECT_EQ(out, chunk("Hel"));
  EXPECT_EQ(first.delivered(), 3);

  // The re-sent request replays "Hel" + more in its first chunk, after a role delta.
  ResumeFilter again(first.delivered(), true);
  const std::string role = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"},\"finish_reason\":null,\"index\":0}]}\n\n";
  std::string in = role + chunk("Hello") + chunk(" world") + "data: [DONE]\n\n";
  out = again.feed(in.data(), in.size());
  EXPECT_EQ(out, "data: {\"choices\":[{\"delta\":{\"content\":\"lo\"},\"finish_reason\":null,\"index\":0}]}\n\n" + chunk(" world") +
                     "data: [DONE]\n\n");
  EXPECT_TRUE(again.done());
  EXPECT_EQ(again.delivered(), 11);
}

TEST(ResumeFilter, CompletionsTextAndAFinishInsideTheReplay) {
  ResumeFilter f(5, true);
  const std::string in = "data: {\"choices\":[{\"text\":\"abc\",\"index\":0,\"finish_reason\":null}]}\n\n"
                         "data: {\"choices\":[{\"text\":\"de\",\"index\":0,\"finish_reason\":\"length\"}]}\n\n";
  const std::string out = f.feed(in.data(), in.size());
  EXPECT_EQ(out, "data: {\"choices\":[{\"finish_reason\":\"length\",\"index\":0,\"text\":\"\"}]}\n\n");
}

TEST(Router, PicksByRendezvousAndSkipsExcluded) {
  RouterOptions o;
  o.replicas = {"http://127.0.0.1:1", "http://127.0.0.1:2", "http://127.0.0.1:3"};
  Router r(o);
  RouteKey k;
  k.prefix = "system prompt";
  const int a = r.pick(k, {});
  EXPECT_EQ(r.pick(k, {}), a) << "the same prefix, the same replica";
  const int b = r.pick(k, {a});
  EXPECT_NE(b, a);
  EXPECT_EQ(r.pick(k, {0, 1, 2}), -1);
  std::set<int> seen;
  for (int i = 0; i < 64; ++i) {
    k.prefix = "conversation " + std::to_string(i);
    seen.insert(r.pick(k, {}));
  }
  EXPECT_EQ(seen.size(), 3u) << "prefixes spread over the replicas";
}

}  // namespace
}  // namespace strata::router
