// demote_to_tiers (engine/kv_tier_io.h) over an executor whose pool is plain host memory and
// which counts its copies: evicted blocks are copied straight into host slots, once; a block host
// memory already holds is not read from the pool again; blocks host memory has no room for go
// through the batched copy and still reach the disk; a failed copy leaves no block behind.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <unistd.h>

#include "engine/kv_tier_io.h"

namespace strata {
namespace {

namespace fs = std::filesystem;

constexpr int64_t kBlockBytes = 96;  // tensors of 32 + 64 bytes

// A pool of n blocks in host memory; counts the blocks each copy path reads.
class CountingExecutor final : public StepExecutor {
 public:
  explicit CountingExecutor(int32_t n) : pool_(size_t(n) * kBlockBytes) {
    std::mt19937 r(3);
    for (auto& b : pool_) b = uint8_t(r());
  }
  const StepRows& run(const StepPlan&, const std::vector<uint8_t>&, std::span<const RowSample>) override {
    throw std::logic_error("not a model");
  }
  int32_t vocab() const override { return 0; }
  int32_t n_kv_blocks() const override { return int32_t(pool_.size() / kBlockBytes); }
  bool device_argmax() const override { return false; }
  int64_t state_floats() const override { return 0; }
  void save_state(int32_t, float*) override {}
  void load_state(int32_t, const float*) override {}
  std::vector<int64_t> block_tensor_bytes() const override { return {32, 64}; }
  void read_block(int32_t block, uint8_t* out) override {
    std::memcpy(out, pool_.data() + size_t(block) * kBlockBytes, kBlockBytes);
    ++single_reads;
  }
  void write_block(int32_t block, const uint8_t* in) override {
    std::memcpy(pool_.data() + size_t(block) * kBlockBytes, in, kBlockBytes);
  }
  void read_blocks_to(std::span<const int32_t> blocks, std::span<uint8_t* const> outs) override {
    if (fail) throw std::runtime_error("copy failed");
    direct_reads += int64_t(blocks.size());
    for (size_t i = 0; i < blocks.size(); ++i) std::memcpy(outs[i], bytes(blocks[i]).data(), kBlockBytes);
  }
  void read_blocks(std::span<const int32_t> blocks, uint8_t* out) override {
    batched_reads += int64_t(blocks.size());
    StepExecutor::read_blocks(blocks, out);
  }
  std::vector<uint8_t> bytes(int32_t block) const {
    const auto* p = pool_.data() + size_t(block) * kBlockBytes;
    return std::vector<uint8_t>(p, p + kBlockBytes);
  }
  int64_t direct_reads = 0, batched_reads = 0, single_reads = 0;
  bool fail = false;

 private:
  std::vector<uint8_t> pool_;
};

std::vector<uint8_t> fetched(KvTiers& t, uint64_t hash) {
  std::vector<uint8_t> out(kBlockBytes);
  EXPECT_TRUE(t.fetch(hash, out.data())) << hash;
  return out;
}

TEST(EngineTierIo, DemotesStraightIntoHostSlotsAndSkipsBlocksHostMemoryHolds) {
  const fs::path dir = fs::temp_directory_path() / ("strata_tier_io_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto tiers = make_kv_tiers(std::vector<int64_t>{32, 64}, "test", 4 * kBlockBytes, dir.string(), int64_t(1) << 20);
  ASSERT_TRUE(tiers.ok()) << tiers.error().to_string();
  KvTiers& t = **tiers;
  CountingExecutor ex(8);
  std::vector<uint8_t> scratch;
  const std::vector<int32_t> b1 = {0, 1, 2};
  const std::vector<uint64_t> h1 = {10, 11, 12};
  demote_to_tiers(t, ex, b1, h1, scratch);
  EXPECT_EQ(ex.direct_reads, 3);
  EXPECT_EQ(ex.batched_reads, 0);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(fetched(t, h1[i]), ex.bytes(b1[i])) << h1[i];
  // 11 again (from pool block 5, say after a promotion): host memory holds it, nothing is read.
  const std::vector<int32_t> b2 = {5, 3};
  const std::vector<uint64_t> h2 = {11, 13};
  demote_to_tiers(t, ex, b2, h2, scratch);
  EXPECT_EQ(ex.direct_reads, 4);  // only 13
  EXPECT_EQ(fetched(t, 11), ex.bytes(1));
  EXPECT_EQ(fetched(t, 13), ex.bytes(3));
  EXPECT_EQ(t.stats().demote_copies_skipped, 1);
  // Host memory full of pinned blocks: an unpinned block has no slot, goes the batched way and
  // still reaches the disk.
  t.pin(h1, tier_clock_s() + 600.0);
  t.pin(std::vector<uint64_t>{13}, tier_clock_s() + 600.0);
  const std::vector<int32_t> b3 = {6};
  const std::vector<uint64_t> h3 = {14};
  demote_to_tiers(t, ex, b3, h3, scratch);
  EXPECT_EQ(ex.batched_reads, 1);
  EXPECT_FALSE(t.contains_host(14));
  ASSERT_TRUE(t.flush(10.0));
  EXPECT_TRUE(t.contains(14));
  EXPECT_EQ(fetched(t, 14), ex.bytes(6));
  // Every block demoted so far is on disk with the pool's bytes.
  for (auto [h, b] : std::vector<std::pair<uint64_t, int32_t>>{{10, 0}, {11, 1}, {12, 2}, {13, 3}, {14, 6}}) {
    std::vector<uint8_t> out(kBlockBytes);
    ASSERT_TRUE(t.disk()->read(h, out.data())) << h;
    EXPECT_EQ(out, ex.bytes(b)) << h;
  }
  fs::remove_all(dir);
}

TEST(EngineTierIo, FailedCopyLeavesNoBlockBehind) {
  auto tiers = make_kv_tiers(std::vector<int64_t>{32, 64}, "test", 4 * kBlockBytes, "", 0);
  ASSERT_TRUE(tiers.ok());
  KvTiers& t = **tiers;
  CountingExecutor ex(8);
  ex.fail = true;
  std::vector<uint8_t> scratch;
  const std::vector<int32_t> b = {0, 1, 2, 3};
  const std::vector<uint64_t> h = {20, 21, 22, 23};
  EXPECT_THROW(demote_to_tiers(t, ex, b, h, scratch), std::runtime_error);
  for (uint64_t x : h) EXPECT_FALSE(t.contains(x));
  // The reserved slots came back: four blocks fit again.
  ex.fail = false;
  demote_to_tiers(t, ex, b, h, scratch);
  for (size_t i = 0; i < h.size(); ++i) EXPECT_EQ(fetched(t, h[i]), ex.bytes(b[i]));
  EXPECT_EQ(t.stats().host_evictions, 0);
}

}  // namespace
}  // namespace strata
