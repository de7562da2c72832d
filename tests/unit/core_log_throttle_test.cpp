// log::Throttle: the first occurrence is logged, later ones at most once per interval, each
// logged one reporting how many were held back since the last.
#include <gtest/gtest.h>

#include <thread>

#include "core/log.h"

namespace strata {
namespace {

TEST(LogThrottle, FirstThenOncePerIntervalWithTheCountHeldBack) {
  log::Throttle t(std::chrono::milliseconds(200));
  int64_t held = -1;
  EXPECT_TRUE(t.take(&held));
  EXPECT_EQ(held, 0);
  held = -1;
  EXPECT_FALSE(t.take(&held));
  EXPECT_FALSE(t.take(&held));
  EXPECT_EQ(held, -1);  // untouched when not logged
  std::this_thread::sleep_for(std::chrono::milliseconds(250));
  EXPECT_TRUE(t.take(&held));
  EXPECT_EQ(held, 2);
  EXPECT_FALSE(t.take(&held));
  EXPECT_EQ(log::Throttle::held_note(0), "");
  EXPECT_EQ(log::Throttle::held_note(2), " (2 more since the last line)");
}

}  // namespace
}  // namespace strata
