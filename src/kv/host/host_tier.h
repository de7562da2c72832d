// HostTier: KV blocks evicted from the device pool, kept in host memory under a byte budget,
// least recently used first out. Keys are the blocks' chained prefix hashes (prefix_index.h);
// values are one block's bytes in the layout the engine gathers them in. Driven by one thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <unordered_map>
#include <vector>

namespace strata {

class HostTier {
 public:
  explicit HostTier(int64_t max_bytes) : max_bytes_(max_bytes) {}

  // Stores a copy of `n` bytes under `hash` (refreshing it when present), evicting the least
  // recently used blocks past the budget. A block larger than the budget is not kept.
  void put(uint64_t hash, const uint8_t* data, size_t n);
  bool contains(uint64_t hash) const { return map_.count(hash) > 0; }
  // The block's bytes (and it becomes most recently used), null when absent.
  const std::vector<uint8_t>* get(uint64_t hash);

  int64_t bytes() const { return bytes_; }
  int64_t n_blocks() const { return int64_t(map_.size()); }
  int64_t evictions() const { return evictions_; }

 private:
  struct Entry {
    std::vector<uint8_t> data;
    std::list<uint64_t>::iterator lru;
  };
  int64_t max_bytes_;
  int64_t bytes_ = 0;
  int64_t evictions_ = 0;
  std::list<uint64_t> lru_;  // most recent at the front
  std::unordered_map<uint64_t, Entry> map_;
};

}  // namespace strata
