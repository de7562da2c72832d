#include "engine/kv_tier_io.h"

#include <cstring>

namespace strata {

void demote_to_tiers(KvTiers& tiers, StepExecutor& exec, std::span<const int32_t> blocks,
                     std::span<const uint64_t> hashes, std::vector<uint8_t>& scratch) {
  tiers.settle(false);
  if (blocks.empty()) return;
  std::vector<uint8_t*> slots;
  std::vector<uint8_t> present;
  tiers.reserve_demotions(hashes, slots, present);
  std::vector<int32_t> direct, copied;
  std::vector<uint8_t*> places;
  std::vector<uint64_t> copied_hashes;
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (present[i]) continue;
    if (slots[i] != nullptr) {
      direct.push_back(blocks[i]);
      places.push_back(slots[i]);
    } else {
      copied.push_back(blocks[i]);
      copied_hashes.push_back(hashes[i]);
    }
  }
  uint64_t ticket = 0;
  try {
    ticket = exec.read_blocks_to_async(direct, places);
  } catch (...) {
    tiers.cancel_demotions(slots);
    throw;
  }
  if (ticket == 0) {
    tiers.commit_demotions(hashes, slots);
  } else {
    // The copies land behind this call (the blocks' next owner may be written meanwhile).
    tiers.defer_commit(std::vector<uint64_t>(hashes.begin(), hashes.end()), std::move(slots),
                       [&exec, ticket](bool wait) { return exec.reads_landed(ticket, wait); });
  }
  if (copied.empty()) return;
  const size_t bb = size_t(tiers.block_bytes());
  scratch.resize(copied.size() * bb);
  exec.read_blocks(copied, scratch.data());
  for (size_t i = 0; i < copied.size(); ++i) tiers.demote(copied_hashes[i], scratch.data() + i * bb);
}

Result<std::unique_ptr<KvTiers>> make_kv_tiers(const KvStorage& kv, int n_layers, const std::string& identity,
                                               int64_t host_bytes, const std::string& disk_dir, int64_t disk_bytes,
                                               double disk_read_delay_s) {
  return make_kv_tiers(tier_tensor_bytes(kv, n_layers), identity, host_bytes, disk_dir, disk_bytes, disk_read_delay_s);
}

Result<std::unique_ptr<KvTiers>> make_kv_tiers(const std::vector<int64_t>& tensors, const std::string& identity,
                                               int64_t host_bytes, const std::string& disk_dir, int64_t disk_bytes,
                                               double disk_read_delay_s, std::unique_ptr<RedisTier> redis) {
  int64_t block_bytes = 0;
  for (int64_t b : tensors) block_bytes += b;
  std::unique_ptr<DiskTier> disk;
  if (!disk_dir.empty()) {
    DiskTierOptions o;
    o.dir = disk_dir;
    o.max_bytes = disk_bytes;
    o.identity = identity;
    o.tensor_bytes = tensors;
    o.read_delay_s = disk_read_delay_s;
    auto d = DiskTier::open(std::move(o));
    if (!d.ok()) return d.error();
    disk = std::move(d).value();
  }
  return std::make_unique<KvTiers>(block_bytes, host_bytes, std::move(disk), std::move(redis));
}

}  // namespace strata
