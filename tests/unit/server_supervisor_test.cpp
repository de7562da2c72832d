// The supervisor's pure parts: the child's command line and the stream part filter that
// forwards each part of a re-sent stream once.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "server/supervisor.h"

namespace strata::server {
namespace {

using Args = std::vector<std::string>;

TEST(SupervisorCommandLine, DropsSuperviseHostAndPortInBothSpellings) {
  const Args own = {"./strata", "--log-level", "debug", "serve", "--supervise", "--port", "8080", "--model", "m",
                    "--host=0.0.0.0", "--port=9", "--threads", "2", "--host", "::"};
  const Args got = child_command_line(own, "/abs/strata", {"--checkpoint-every", "32"});
  const Args want = {"/abs/strata", "--log-level", "debug", "serve", "--model", "m", "--threads", "2",
                     "--host", "127.0.0.1", "--port", "0", "--supervised-child", "--checkpoint-every", "32"};
  EXPECT_EQ(got, want);
}

// Feeds text in pieces of `step` bytes and returns what the filter emitted.
std::string feed(PartFilter& f, const std::string& text, size_t step) {
  std::string out;
  for (size_t i = 0; i < text.size(); i += step) {
    f.feed(text.data() + i, std::min(step, text.size() - i), [&](const std::string& s) {
      EXPECT_FALSE(s.empty());
      out += s;
    });
  }
  return out;
}

std::string part(const std::string& label) { return std::string(kPartPrefix) + label + "\n\n"; }

std::string event(const std::string& payload) { return "data: " + payload + "\n\n"; }

TEST(PartFilter, ForwardsEachPartOnceAcrossAttempts) {
  // A stream of 4 tokens; token 2 has no text (held back), token 4 has two events.
  const std::string start = event("role") + part("start");
  const std::string t1 = event("a") + part("token 1");
  const std::string t2 = part("token 2");
  const std::string t3 = event("b") + part("token 3");
  const std::string t4 = "event: x\ndata: c\n\n" + event("d") + part("token 4");
  const std::string end = event("finish") + event("[DONE]") + part("end");
  const std::string whole = event("role") + event("a") + event("b") + "event: x\ndata: c\n\n" + event("d") +
                            event("finish") + event("[DONE]");
  for (size_t step : {size_t(1), size_t(3), size_t(1000)}) {
    PartFilter f;
    // The first attempt is cut inside token 3's text: only parts already labeled go out.
    std::string out = feed(f, start + t1 + t2 + t3.substr(0, 4), step);
    EXPECT_EQ(out, event("role") + event("a"));
    EXPECT_EQ(f.delivered(), 2);
    EXPECT_FALSE(f.ended());
    // The re-sent request replays everything from the start (its checkpointed tokens first).
    f.begin_attempt();
    out += feed(f, start + t1 + t2 + t3 + t4.substr(0, 20), step);
    EXPECT_EQ(f.delivered(), 3);
    // Cut again, inside token 4; a third attempt finishes.
    f.begin_attempt();
    out += feed(f, start + t1 + t2 + t3 + t4 + end, step);
    EXPECT_TRUE(f.ended());
    EXPECT_EQ(f.delivered(), 4);
    EXPECT_EQ(out, whole) << "step " << step;
  }
}

TEST(PartFilter, LostPartMarksTheAttemptAndEmitsNothing) {
  PartFilter f;
  std::string out = feed(f, event("role") + part("start") + event("a") + part("token 1") + event("x") + part("lost"), 7);
  EXPECT_EQ(out, event("role") + event("a"));
  EXPECT_TRUE(f.lost());
  EXPECT_FALSE(f.ended());
  f.begin_attempt();
  EXPECT_FALSE(f.lost());
}

}  // namespace
}  // namespace strata::server
