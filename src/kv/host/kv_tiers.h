// KvTiers: the KV tiers below the device pool, host memory then disk, as the engine sees them.
//
// demote(): a published block the device pool evicts is copied into the host tier and queued
// for the disk writer at the same time (write-through: the disk holds every demoted block
// durably, so a restart finds it even when the host tier never had to let it go; the host
// tier's own evictions are then plain drops). fetch(): a prefix lookup that continues past
// the device index finds a block in host memory, else on disk (a disk hit is copied up to the
// host tier). Only the full-attention pool's blocks are tiered: models with sliding-window
// layers or recurrent state (which need the window pool or a state snapshot as well) run
// without tiers.
//
// Sessions: pin() keeps a session's blocks in both tiers past LRU eviction until the session's
// TTL (HostTier, DiskTier say how the budgets treat pinned blocks); a block pinned while still
// in the device pool keeps the pin when it demotes later.
//
// Thread-safe: the engine thread demotes and looks up, the promotion thread
// (engine/kv_tier_promoter.h) fetches, the disk tier has its own writer thread.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kv/disk/disk_tier.h"
#include "kv/host/host_tier.h"

namespace strata {

struct KvTierStats {
  bool enabled = false;
  int64_t host_blocks = 0;
  int64_t host_bytes = 0;
  int64_t host_evictions = 0;
  int64_t host_pinned_evictions = 0;  // pinned blocks the host budget had to drop
  int64_t demoted_blocks = 0;
  int64_t host_hit_blocks = 0;
  int64_t disk_hit_blocks = 0;
  int64_t promote_failures = 0;  // a block listed in a tier that could not be read
  int64_t pinned_blocks = 0;     // session pins set, since start
  DiskTierStats disk;
};

class KvTiers {
 public:
  // host_bytes 0: no host tier; disk null: no disk tier.
  KvTiers(int64_t block_bytes, int64_t host_bytes, std::unique_ptr<DiskTier> disk);

  int64_t block_bytes() const { return block_bytes_; }
  void demote(uint64_t hash, const uint8_t* data);
  bool contains(uint64_t hash) const;
  bool contains_host(uint64_t hash) const;
  // Session pin: each block stays out of LRU eviction in both tiers until `until`
  // (tier_clock_s(), kv/host/host_tier.h).
  void pin(std::span<const uint64_t> hashes, double until);
  // Copies the block into `out` (block_bytes()); false on a miss or an unreadable block.
  bool fetch(uint64_t hash, uint8_t* out);
  // Copies blocks into out + i * block_bytes() until the first one neither tier can serve;
  // returns how many. Disk blocks are read together (DiskTier::read_many) and, unlike fetch(),
  // not copied up to host memory: they go into pool blocks, which demote there when evicted.
  int32_t fetch_many(std::span<const uint64_t> hashes, uint8_t* out);
  // Starts the disk reads of those of `hashes` not in host memory (DiskTier::prefetch).
  void prefetch(std::span<const uint64_t> hashes);
  // Waits for the disk writer's queue, at most timeout_s. True when nothing is left queued.
  bool flush(double timeout_s);
  KvTierStats stats() const;
  DiskTier* disk() { return disk_.get(); }

 private:
  int64_t block_bytes_;
  std::unique_ptr<HostTier> host_;
  std::unique_ptr<DiskTier> disk_;
  mutable std::mutex mu_;  // host_ and the counters; disk_ locks itself
  int64_t demoted_ = 0, host_hits_ = 0, disk_hits_ = 0, failures_ = 0, pinned_ = 0;
};

}  // namespace strata
