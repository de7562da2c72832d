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
}

HostTier::~HostTier() {
  if (slab_ != nullptr) munmap(slab_, slab_bytes_);
}

void HostTier::erase(uint64_t hash) {
  auto it = map_.find(hash);
  if (it == map_.end()) return;
  lru_.erase(it->second.lru);
  bytes_ -= int64_t(block_bytes_);
  free_slots_.push_back(it->second.slot);
  map_.erase(it);
}

void HostTier::put(uint64_t hash, const uint8_t* data) {
  erase(hash);
  const size_t n = block_bytes_;
  if (int64_t(n) > max_bytes_) return;
  const double now = tier_clock_s();
  const bool incoming_pinned = pinned(hash, now);
  // Unpinned blocks first, least recently used first; then, only for a pinned newcomer, pinned ones.
  auto it = lru_.end();
  while (bytes_ + int64_t(n) > max_bytes_ && it != lru_.begin()) {
    --it;
    if (pinned(*it, now)) continue;
    const uint64_t victim = *it;
    it = std::next(it);  // erase() invalidates the victim's node only
    erase(victim);
    ++evictions_;
  }
  if (bytes_ + int64_t(n) > max_bytes_) {
    if (!incoming_pinned) return;
    while (bytes_ + int64_t(n) > max_bytes_ && !lru_.empty()) {
      erase(lru_.back());
      ++evictions_;
      ++pinned_evictions_;
    }
  }
  lru_.push_front(hash);
  Entry e;
  e.slot = free_slots_.back();
  free_slots_.pop_back();
  std::memcpy(slab_ + size_t(e.slot) * n, data, n);
  e.lru = lru_.begin();
  map_.emplace(hash, e);
  bytes_ += int64_t(n);
}

const uint8_t* HostTier::get(uint64_t hash) {
  auto it = map_.find(hash);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return slab_ + size_t(it->second.slot) * block_bytes_;
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
