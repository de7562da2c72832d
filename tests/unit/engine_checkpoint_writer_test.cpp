// CheckpointWriter: checkpoints reach the store off the caller's thread in order; a queued
// write is replaced by its request's newer one; a full queue drops (counted) instead of
// blocking; a removal cancels the key's queued writes and lands after what came before it, so
// a finished request's file never comes back; destruction writes what is queued.
#include <gtest/gtest.h>

#include <filesystem>

#include "../support/test_dir.h"
#include "engine/checkpoint_writer.h"

namespace strata {
namespace {

Checkpoint sample(const std::string& key, uint64_t run, int32_t n) {
  Checkpoint c;
  c.key = key;
  c.run = run;
  for (int32_t i = 0; i < n; ++i) c.generated.push_back(100 + i);
  c.generation = n;
  c.sampler = "sampler-" + std::to_string(n);
  return c;
}

std::unique_ptr<CheckpointStore> open_store() {
  auto s = CheckpointStore::open(test::fresh_test_dir("strata_ckpt_writer").string(), "identity-a");
  EXPECT_TRUE(s.ok()) << (s.ok() ? "" : s.error().to_string());
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(CheckpointWriter, WritesInTheBackgroundAndCoalescesPerRequest) {
  auto store = open_store();
  ASSERT_TRUE(store);
  CheckpointWriter w(*store, size_t(1) << 20, /*start=*/false);
  EXPECT_TRUE(w.write(sample("a", 1, 4)));
  EXPECT_TRUE(w.write(sample("b", 2, 4)));
  EXPECT_TRUE(w.write(sample("a", 1, 8)));  // replaces a's queued one
  EXPECT_FALSE(store->load("a")) << "nothing is written before the thread runs";
  EXPECT_EQ(w.stats().queued, 2);
  EXPECT_EQ(w.stats().coalesced, 1);
  w.start();
  ASSERT_TRUE(w.flush(10.0));
  auto a = store->load("a");
  ASSERT_TRUE(a);
  EXPECT_EQ(a->generation, 8);
  EXPECT_EQ(a->generated.size(), 8u);
  ASSERT_TRUE(store->load("b"));
  const CheckpointWriterStats s = w.stats();
  EXPECT_EQ(s.written, 2);
  EXPECT_EQ(s.dropped, 0);
  EXPECT_EQ(s.queued, 0);
  EXPECT_EQ(s.queued_bytes, 0);
}

TEST(CheckpointWriter, AFullQueueDropsInsteadOfBlocking) {
  auto store = open_store();
  ASSERT_TRUE(store);
  const size_t one = CheckpointWriter::queued_size(sample("k0", 1, 16));
  CheckpointWriter w(*store, 3 * one, /*start=*/false);
  int accepted = 0;
  for (int i = 0; i < 5; ++i) accepted += w.write(sample("k" + std::to_string(i), uint64_t(i + 1), 16)) ? 1 : 0;
  EXPECT_EQ(accepted, 3);
  EXPECT_EQ(w.stats().dropped, 2);
  // A newer write of a queued request that would not fit is dropped; the older one stays.
  EXPECT_FALSE(w.write(sample("k0", 1, 64)));
  EXPECT_EQ(w.stats().dropped, 3);
  w.start();
  ASSERT_TRUE(w.flush(10.0));
  EXPECT_EQ(w.stats().written, 3);
  ASSERT_TRUE(store->load("k0"));
  EXPECT_EQ(store->load("k0")->generation, 16);
  EXPECT_FALSE(store->load("k3"));
  // Once drained there is room again.
  EXPECT_TRUE(w.write(sample("k3", 4, 16)));
  ASSERT_TRUE(w.flush(10.0));
  EXPECT_TRUE(store->load("k3"));
}

TEST(CheckpointWriter, RemoveCancelsQueuedWritesAndLandsInOrder) {
  auto store = open_store();
  ASSERT_TRUE(store);
  {
    CheckpointWriter w(*store, size_t(1) << 20);
    ASSERT_TRUE(w.write(sample("a", 1, 4)));
    ASSERT_TRUE(w.flush(10.0));
    ASSERT_TRUE(store->load("a"));
  }
  CheckpointWriter w(*store, size_t(1) << 20, /*start=*/false);
  EXPECT_TRUE(w.write(sample("a", 1, 8)));
  w.remove("a", 1, 8);
  EXPECT_TRUE(w.write(sample("a", 1, 12)));  // after the removal: the run is retired, refused
  EXPECT_EQ(w.stats().queued, 1);
  w.start();
  ASSERT_TRUE(w.flush(10.0));
  EXPECT_FALSE(store->load("a")) << "a finished request's checkpoint never comes back";
  EXPECT_EQ(w.stats().written, 0);
}

TEST(CheckpointWriter, ARemovedRunIsNotResumedBeforeItsFileIsGone) {
  auto store = open_store();
  ASSERT_TRUE(store);
  {
    CheckpointWriter w(*store, size_t(1) << 20);
    ASSERT_TRUE(w.write(sample("a", 7, 4)));
    ASSERT_TRUE(w.flush(10.0));
  }
  CheckpointWriter w(*store, size_t(1) << 20, /*start=*/false);
  w.remove("a", 7, 4);
  EXPECT_TRUE(std::filesystem::exists(store->path_of("a"))) << "the deletion waits for the thread";
  EXPECT_FALSE(store->load("a")) << "but the finished run is not resumed meanwhile";
  w.start();
  ASSERT_TRUE(w.flush(10.0));
  EXPECT_FALSE(std::filesystem::exists(store->path_of("a")));
}

TEST(CheckpointWriter, DestructionWritesWhatIsQueued) {
  auto store = open_store();
  ASSERT_TRUE(store);
  {
    CheckpointWriter w(*store, size_t(1) << 20, /*start=*/false);
    for (int i = 0; i < 20; ++i) ASSERT_TRUE(w.write(sample("k" + std::to_string(i), uint64_t(i + 1), 8)));
  }
  for (int i = 0; i < 20; ++i) EXPECT_TRUE(store->load("k" + std::to_string(i))) << i;
}

}  // namespace
}  // namespace strata
