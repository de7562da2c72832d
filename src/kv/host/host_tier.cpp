#include "kv/host/host_tier.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <new>

namespace strata {

HostTier::HostTier(int64_t max_bytes, size_t block_bytes) : block_bytes_(std::max<size_t>(block_bytes, 1)) {
  const int64_t slots = std::max<int64_t>(max_bytes, 0) / int64_t(block_bytes_);
  max_bytes_ = slots * int64_t(block_bytes_);
  slab_bytes_ = size_t(max_bytes_);
  if (slab_bytes_ > 0) {
    void* p = mmap(nullptr, slab_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    slab_ = static_cast<uint8_t*>(p);
  }
  free_slots_.reserve(size_t(slots));
  for (int64_t i = slots - 1; i >= 0; --i) free_slots_.push_back(i);
  refs_.assign(size_t(slots), 0);
  orphaned_.assign(size_t(slots), 0);
}

HostTier::~HostTier() {
  if (slab_ != nullptr) munmap(slab_, slab_bytes_);
}

void HostTier::free_slot(int64_t slot) {
  if (refs_[size_t(slot)] > 0) {
    orphaned_[size_t(slot)] = 1;  // a lease still reads it: freed at the last release
  } else {
    free_slots_.push_back(slot);
  }
}

void HostTier::erase(uint64_t hash) {
  auto it = map_.find(hash);
  if (it == map_.end()) return;
  lru_.erase(it->second.lru);
  bytes_ -= int64_t(block_bytes_);
  free_slot(it->second.slot);
  map_.erase(it);
}

bool HostTier::make_room(uint64_t hash) {
  erase(hash);
  const double now = tier_clock_s();
  // Unpinned blocks first, least recently used first; then, only for a pinned newcomer, pinned
  // ones. Slots still leased or reserved are not free even when their bytes left the budget.
  auto it = lru_.end();
  while (free_slots_.empty() && it != lru_.begin()) {
    --it;
    if (pinned(*it, now)) continue;
    const uint64_t victim = *it;
    it = std::next(it);  // erase() invalidates the victim's node only
    erase(victim);
    ++evictions_;
  }
  if (free_slots_.empty()) {
    if (!pinned(hash, now)) return false;
    while (free_slots_.empty() && !lru_.empty()) {
      erase(lru_.back());
      ++evictions_;
      ++pinned_evictions_;
    }
  }
  return !free_slots_.empty();
}

void HostTier::put(uint64_t hash, const uint8_t* data) {
  uint8_t* slot = reserve(hash);
  if (slot == nullptr) return;
  std::memcpy(slot, data, block_bytes_);
  commit(hash, slot);
}

uint8_t* HostTier::reserve(uint64_t hash) {
  if (!make_room(hash)) return nullptr;
  const int64_t slot = free_slots_.back();
  free_slots_.pop_back();
  return slab_ + size_t(slot) * block_bytes_;
}

void HostTier::commit(uint64_t hash, uint8_t* slot) {
  erase(hash);  // a block stored under the hash meanwhile is replaced
  lru_.push_front(hash);
  Entry e;
  e.slot = slot_of(slot);
  e.lru = lru_.begin();
  map_.emplace(hash, e);
  bytes_ += int64_t(block_bytes_);
}

void HostTier::cancel(uint8_t* slot) { free_slot(slot_of(slot)); }

const uint8_t* HostTier::get(uint64_t hash) {
  auto it = map_.find(hash);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return slab_ + size_t(it->second.slot) * block_bytes_;
}

const uint8_t* HostTier::lease(uint64_t hash) {
  const uint8_t* p = get(hash);
  if (p == nullptr) return nullptr;
  if (refs_[size_t(slot_of(p))]++ == 0) ++leased_slots_;
  return p;
}

void HostTier::release(const uint8_t* p) {
  const size_t slot = size_t(slot_of(p));
  if (--refs_[slot] > 0) return;
  --leased_slots_;
  if (orphaned_[slot]) {
    orphaned_[slot] = 0;
    free_slots_.push_back(int64_t(slot));
  }
}

void HostTier::pin(uint64_t hash, double until) {
  double& u = pins_[hash];
  u = std::max(u, until);
  // Expired pins are dropped once the map has doubled since the last sweep: amortized O(1).
  if (pins_.size() > 2 * pins_pruned_at_ + 1024) prune_pins(tier_clock_s());
}

bool HostTier::pinned(uint64_t hash, double now) const {
  auto it = pins_.find(hash);
  return it != pins_.end() && it->second > now;
}

void HostTier::prune_pins(double now) {
  std::erase_if(pins_, [now](const auto& p) { return p.second <= now; });
  pins_pruned_at_ = pins_.size();
}

}  // namespace strata
