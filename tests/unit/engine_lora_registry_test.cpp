// LoraRegistry: names resolve to slots while loaded; a run-time load is installed through
// take_changes(); an unload hides the name at once and clears the slot only when its last use
// ends; slots are never reused.
#include <gtest/gtest.h>

#include "engine/lora_registry.h"

namespace strata {
namespace {

std::shared_ptr<const LoraAdapter> adapter(uint64_t hash) {
  auto a = std::make_shared<LoraAdapter>();
  a->content_hash = hash;
  return a;
}

TEST(LoraRegistry, LoadUseUnloadAndFreeAfterTheLastUse) {
  LoraRegistry r;
  r.reserve_slots(1);
  r.add_installed("start", 0, 7);
  ASSERT_TRUE(r.add("late", adapter(9)).ok());
  EXPECT_FALSE(r.add("late", adapter(10)).ok()) << "a name is loaded once";
  auto changes = r.take_changes();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].slot, 1);
  ASSERT_TRUE(changes[0].adapter);
  EXPECT_EQ(changes[0].adapter->content_hash, 9u);
  EXPECT_EQ(r.names(), (std::vector<std::string>{"late", "start"}));

  auto use = r.acquire("late");
  ASSERT_TRUE(use.ok());
  EXPECT_EQ(use->slot, 1);
  EXPECT_EQ(use->hash, 9u);
  ASSERT_TRUE(r.remove("late").ok());
  EXPECT_FALSE(r.acquire("late").ok()) << "gone for new requests at once";
  EXPECT_TRUE(r.take_changes().empty()) << "but its slot stays while a request uses it";
  r.release(use->slot);
  changes = r.take_changes();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].slot, 1);
  EXPECT_FALSE(changes[0].adapter) << "cleared";

  ASSERT_TRUE(r.add("late", adapter(11)).ok());
  changes = r.take_changes();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].slot, 2) << "a slot id always means one adapter";
  auto miss = r.acquire("nope");
  ASSERT_FALSE(miss.ok());
  EXPECT_NE(miss.error().message.find("loaded: late, start"), std::string::npos) << miss.error().message;
  EXPECT_FALSE(r.remove("nope").ok());
}

}  // namespace
}  // namespace strata
