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
// Direct copies: a caller that copies blocks itself (a device DMA into or out of host memory,
// possibly registered with the device: host_memory()) demotes through reserve_demotions() /
// commit_demotions() and promotes through fetch_batch() / release(). A block host memory
// already holds is not copied down again (its bytes are those of its hash); demoted blocks go
// to the disk writer by reference to their host slot (one copy in host memory, not two).
//
// Sessions: pin() keeps a session's blocks in both tiers past LRU eviction until the session's
// TTL (HostTier, DiskTier say how the budgets treat pinned blocks); a block pinned while still
// in the device pool keeps the pin when it demotes later.
//
// Shared tier (kv/redis/redis_tier.h, optional): every demoted block and every block share()d
// is queued for Redis too; a lookup that misses host and disk asks Redis for the rest of the
// chain in one round trip (count_remote()), and fetch_batch() reads those blocks from there,
// verified, after host memory and disk. Redis down: its lookups and reads are misses.
//
// Thread-safe: the engine thread demotes and looks up, the promotion thread
// (engine/kv_tier_promoter.h) fetches, the disk tier has its own writer thread.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "kv/disk/disk_tier.h"
#include "kv/host/host_tier.h"
#include "kv/redis/redis_tier.h"

namespace strata {

struct KvTierStats {
  bool enabled = false;
  int64_t host_blocks = 0;
  int64_t host_bytes = 0;
  int64_t host_evictions = 0;
  int64_t host_pinned_evictions = 0;  // pinned blocks the host budget had to drop
  int64_t demoted_blocks = 0;
  int64_t demote_copies_skipped = 0;  // demoted blocks host memory already held (no copy)
  int64_t host_hit_blocks = 0;
  int64_t disk_hit_blocks = 0;
  int64_t promote_failures = 0;  // a block listed in a tier that could not be read
  int64_t pinned_blocks = 0;     // session pins set, since start
  int64_t redis_hit_blocks = 0;
  DiskTierStats disk;
  RedisTierStats redis;
};

class KvTiers {
 public:
  // host_bytes 0: no host tier; disk null: no disk tier; redis null: no shared tier.
  KvTiers(int64_t block_bytes, int64_t host_bytes, std::unique_ptr<DiskTier> disk,
          std::unique_ptr<RedisTier> redis = nullptr);
  // The disk tier goes first: its writer may still read leased host slots.
  ~KvTiers();
  KvTiers(const KvTiers&) = delete;
  KvTiers& operator=(const KvTiers&) = delete;

  int64_t block_bytes() const { return block_bytes_; }
  void demote(uint64_t hash, const uint8_t* data);
  bool contains(uint64_t hash) const;
  bool contains_host(uint64_t hash) const;
  // How many leading blocks of `hashes` the shared tier holds (0 without one or when it is down).
  int32_t count_remote(std::span<const uint64_t> hashes);
  // The shared tier lacks `hash` as far as this process knows: share() would send it.
  bool shares(uint64_t hash) const { return redis_ && !redis_->known(hash); }
  // Queues a copy of a published block for the shared tier (a no-op without one).
  void share(uint64_t hash, const uint8_t* data);
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
  // Demotion of blocks the caller copies itself. Per hash: present[i] = 1 when host memory holds
  // it already (made most recently used and queued for disk from there if the disk lacks it:
  // nothing to copy), else slots[i] = a reserved host slot of block_bytes() to copy the block
  // into, then commit_demotions(), or null when host memory has no room (demote() the bytes).
  void reserve_demotions(std::span<const uint64_t> hashes, std::vector<uint8_t*>& slots, std::vector<uint8_t>& present);
  // The copies into the slots are done (null slots are skipped): the blocks become visible and
  // are queued for disk from their slots.
  void commit_demotions(std::span<const uint64_t> hashes, std::span<uint8_t* const> slots);
  // The reserved slots go back unused (a failed copy); null ones are skipped.
  void cancel_demotions(std::span<uint8_t* const> slots);
  // Demotions whose copies into the reserved slots are still in flight (a device copies them
  // behind the caller): committed by settle() once `landed` says so. landed(wait) is true once
  // the copies are in the slots (wait: blocks until they are) and throws when a copy failed
  // (the slots are cancelled then). Until committed, the blocks are not visible.
  void defer_commit(std::vector<uint64_t> hashes, std::vector<uint8_t*> slots, std::function<bool(bool)> landed);
  // Commits the deferred demotions whose copies have landed, oldest first; wait: every one.
  void settle(bool wait);
  int64_t unsettled() const;  // deferred demotions (calls) not committed yet
  // Promotion without a host copy, of the leading blocks of `hashes` the tiers hold, stopping
  // before the (max_disk + 1)-th disk block: srcs[i] is block i's bytes, a leased host slot
  // (leased[i] = 1; release() after use) or buf + k * block_bytes() for the k-th disk block of
  // the call (buf holds max_disk blocks). Returns how many; as fetch_many() otherwise. Blocks
  // neither host memory nor disk holds are read from the shared tier (they count as disk
  // blocks here): the caller asked count_remote() first.
  int32_t fetch_batch(std::span<const uint64_t> hashes, int32_t max_disk, uint8_t* buf,
                      std::vector<const uint8_t*>& srcs, std::vector<uint8_t>& leased);
  void release(std::span<const uint8_t* const> slots);
  // The host tier's slab (empty without one), for registering it with a device.
  std::span<uint8_t> host_memory() const;
  // Settles every deferred demotion, then waits for the disk writer's queue, at most
  // timeout_s. True when nothing is left queued.
  bool flush(double timeout_s);
  KvTierStats stats() const;
  DiskTier* disk() { return disk_.get(); }
  RedisTier* redis() { return redis_.get(); }

 private:
  int64_t block_bytes_;
  // Queues host-memory blocks for disk from their leased slots: by reference (the lease ends
  // once written) while the writer holds fewer than a quarter of the host slots so (a leased
  // slot whose block is evicted is not reused before the write: the writer's backlog must not
  // take much of the host budget), past that as a copy (the lease ends at once). Unlocked.
  void queue_disk_from_host(std::span<const uint64_t> hashes, std::span<const uint8_t* const> leased);

  struct Deferred {
    std::vector<uint64_t> hashes;
    std::vector<uint8_t*> slots;
    std::function<bool(bool)> landed;
  };
  mutable std::mutex deferred_mu_;  // deferred_; taken before mu_, never after
  std::deque<Deferred> deferred_;

  std::unique_ptr<HostTier> host_;
  std::unique_ptr<DiskTier> disk_;
  std::unique_ptr<RedisTier> redis_;  // locks itself
  mutable std::mutex mu_;  // host_ and the counters; disk_ locks itself
  int64_t demoted_ = 0, demote_skipped_ = 0, host_hits_ = 0, disk_hits_ = 0, redis_hits_ = 0, failures_ = 0, pinned_ = 0;
  int64_t disk_ref_slots_ = 0;  // host slots the disk writer reads by reference (its leases)
};

}  // namespace strata
