#include "kv/host/host_tier.h"

namespace strata {

void HostTier::put(uint64_t hash, const uint8_t* data, size_t n) {
  auto it = map_.find(hash);
  if (it != map_.end()) {
    lru_.erase(it->second.lru);
    bytes_ -= int64_t(it->second.data.size());
    map_.erase(it);
  }
  if (int64_t(n) > max_bytes_) return;
  while (bytes_ + int64_t(n) > max_bytes_ && !lru_.empty()) {
    auto victim = map_.find(lru_.back());
    bytes_ -= int64_t(victim->second.data.size());
    map_.erase(victim);
    lru_.pop_back();
    ++evictions_;
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

}  // namespace strata
