#include "kv/state_cache.h"

#include <algorithm>

#include "core/check.h"

namespace strata {

StateSlotPool::StateSlotPool(int32_t n_slots) : n_slots_(n_slots), held_(size_t(std::max(n_slots, 0)), false) {
  STRATA_CHECK(n_slots >= 0, "slot count must not be negative");
  for (int32_t s = n_slots - 1; s >= 0; --s) free_.push_back(s);
}

int32_t StateSlotPool::allocate() {
  if (free_.empty()) return -1;
  const int32_t s = free_.back();
  free_.pop_back();
  held_[size_t(s)] = true;
  return s;
}

void StateSlotPool::release(int32_t slot) {
  STRATA_CHECK(slot >= 0 && slot < n_slots_ && held_[size_t(slot)], "state slot " + std::to_string(slot) + " is not held");
  held_[size_t(slot)] = false;
  free_.push_back(slot);
}

StateSnapshotStore::StateSnapshotStore(int64_t capacity_bytes) { stats_.capacity_bytes = capacity_bytes; }

const StateSnapshot* StateSnapshotStore::find(uint64_t hash) {
  auto it = map_.find(hash);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second);
  return &it->second->snapshot;
}

float* StateSnapshotStore::insert(uint64_t hash, int32_t position, size_t n_floats) {
  if (auto it = map_.find(hash); it != map_.end()) {
    STRATA_CHECK(it->second->snapshot.position == position, "one chain hash names two positions");
    lru_.splice(lru_.begin(), lru_, it->second);
    return nullptr;
  }
  const int64_t bytes = int64_t(n_floats * sizeof(float));
  if (bytes > stats_.capacity_bytes) return nullptr;
  while (stats_.bytes + bytes > stats_.capacity_bytes) {
    Entry& victim = lru_.back();
    if (evict_hook_) evict_hook_(victim.hash, victim.snapshot);
    stats_.bytes -= int64_t(victim.snapshot.data.size() * sizeof(float));
    map_.erase(victim.hash);
    lru_.pop_back();
    ++stats_.evictions;
  }
  lru_.push_front(Entry{hash, StateSnapshot{position, std::vector<float>(n_floats)}});
  map_.emplace(hash, lru_.begin());
  stats_.bytes += bytes;
  stats_.count = int64_t(map_.size());
  ++stats_.stores;
  return lru_.front().snapshot.data.data();
}

}  // namespace strata
