// HostTier: KV blocks evicted from the device pool, kept in host memory under a byte budget,
// least recently used first out. Keys are the blocks' chained prefix hashes (prefix_index.h);
// values are one block's bytes in the layout the engine gathers them in.
//
// Session pins: pin(hash, until) keeps a block (present now or put later) out of LRU eviction
// until `until` (seconds of std::chrono::steady_clock, tier_clock_s()). Over the budget,
// unpinned blocks go first, least recently used first; pinned ones go only when nothing
// unpinned is left and the incoming block is pinned too (an unpinned block that would need a
// pinned one's room is not kept). Not thread-safe: KvTiers locks around it.
//
// Copies made elsewhere: reserve() hands out a slot for a block that a device copies into
// directly (commit() then makes it visible, cancel() returns it), and lease() hands out a
// stored block's slot for reading in place (a device copy out of it, the disk writer): a
// leased slot keeps its bytes until release(), even when its block is evicted or replaced
// meanwhile (the slot is reused only after the last release).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace strata {

// The clock session pins of the lower KV tiers are stated in: seconds of steady_clock.
inline double tier_clock_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class HostTier {
 public:
  // Every block is block_bytes; the budget is max_bytes / block_bytes slots in one slab taken
  // and faulted in here (MAP_POPULATE), so a demotion is a copy into resident memory with no
  // allocation or page fault (a 32k-token prompt of an 8B model demotes GiBs at once).
  HostTier(int64_t max_bytes, size_t block_bytes);
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Stores a copy of the block_bytes at `data` under `hash` (refreshing it when present),
  // evicting past the budget as the header says.
  void put(uint64_t hash, const uint8_t* data);
  bool contains(uint64_t hash) const { return map_.count(hash) > 0; }
  // The block's block_bytes bytes (and it becomes most recently used), null when absent. Valid
  // until the next put().
  const uint8_t* get(uint64_t hash);
  size_t block_bytes() const { return block_bytes_; }

  // A slot for `hash` (a present block of that hash goes first), evicting as put() does; the
  // block is not visible until commit(). Null when it does not fit.
  uint8_t* reserve(uint64_t hash);
  // The reserved slot's bytes are written: `hash` is stored there, most recently used.
  void commit(uint64_t hash, uint8_t* slot);
  // The reserved slot goes back unused.
  void cancel(uint8_t* slot);
  // The block's slot (and it becomes most recently used), held until release(); null when absent.
  const uint8_t* lease(uint64_t hash);
  void release(const uint8_t* slot);
  int64_t leased_slots() const { return leased_slots_; }
  int64_t n_slots() const { return int64_t(refs_.size()); }
  // The slab all slots live in (to register it with a device for direct copies).
  uint8_t* slab() const { return slab_; }
  size_t slab_bytes() const { return slab_bytes_; }
  // Exempts `hash` from LRU eviction until `until` (tier_clock_s()); keeps the later expiry.
  void pin(uint64_t hash, double until);
  bool pinned(uint64_t hash, double now) const;

  int64_t bytes() const { return bytes_; }
  int64_t n_blocks() const { return int64_t(map_.size()); }
  int64_t evictions() const { return evictions_; }
  // Blocks evicted while still pinned (the budget held only pinned blocks).
  int64_t pinned_evictions() const { return pinned_evictions_; }

 private:
  struct Entry {
    int64_t slot = 0;  // index into the slab
    std::list<uint64_t>::iterator lru;
  };
  void erase(uint64_t hash);
  void prune_pins(double now);
  // Frees a slot, evicting as the header says; false when none can be had for `hash`.
  bool make_room(uint64_t hash);
  int64_t slot_of(const uint8_t* p) const { return int64_t((p - slab_) / std::ptrdiff_t(block_bytes_)); }
  void free_slot(int64_t slot);

  int64_t max_bytes_;  // slots x block_bytes
  size_t block_bytes_;
  uint8_t* slab_ = nullptr;          // [slots, block_bytes]
  size_t slab_bytes_ = 0;
  std::vector<int64_t> free_slots_;
  std::vector<int32_t> refs_;      // [slots] leases held
  std::vector<uint8_t> orphaned_;  // [slots] 1: its block is gone, freed at the last release
  int64_t leased_slots_ = 0;       // slots with refs_ > 0
  int64_t bytes_ = 0;
  int64_t evictions_ = 0;
  int64_t pinned_evictions_ = 0;
  std::list<uint64_t> lru_;  // most recent at the front
  std::unordered_map<uint64_t, Entry> map_;
  std::unordered_map<uint64_t, double> pins_;  // hash -> expiry (tier_clock_s())
  size_t pins_pruned_at_ = 0;                  // pins_.size() after the last sweep
};

}  // namespace strata
