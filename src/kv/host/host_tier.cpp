#include "kv/host/host_tier.h"

#include <algorithm>

namespace strata {

void HostTier::erase(uint64_t hash) {
  auto it = map_.find(hash);
  if (it == map_.end()) return;
  lru_.erase(it->second.lru);
  bytes_ -= int64_t(it->second.data.size());
  map_.erase(it);
}

void HostTier::put(uint64_t hash, const uint8_t* data, size_t n) {
  erase(hash);
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
  e.data.assign(data, data + n);
  e.lru = lru_.begin();
  map_.emplace(hash, std::move(e));
  bytes_ += int64_t(n);
}

const std::vector<uint8_t>* HostTier::get(uint64_t hash) {
  auto it = map_.find(hash);
  if (it == map_.end()) return nullptr;
  lru_.splice(lru_.begin(), lru_, it->second.lru);
  return &it->second.data;
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
