#include "kv/host/kv_tiers.h"

#include <cstring>

namespace strata {

KvTiers::KvTiers(int64_t block_bytes, int64_t host_bytes, std::unique_ptr<DiskTier> disk)
    : block_bytes_(block_bytes),
      host_(host_bytes > 0 ? std::make_unique<HostTier>(host_bytes, size_t(block_bytes)) : nullptr),
      disk_(std::move(disk)) {}

void KvTiers::demote(uint64_t hash, const uint8_t* data) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++demoted_;
    if (host_) host_->put(hash, data);
  }
  if (disk_) disk_->enqueue(hash, data);
}

bool KvTiers::contains(uint64_t hash) const {
  return contains_host(hash) || (disk_ && disk_->contains(hash));
}

bool KvTiers::contains_host(uint64_t hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return host_ && host_->contains(hash);
}

void KvTiers::pin(std::span<const uint64_t> hashes, double until) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pinned_ += int64_t(hashes.size());
    if (host_) for (uint64_t h : hashes) host_->pin(h, until);
  }
  if (disk_) for (uint64_t h : hashes) disk_->pin(h, until);
}

bool KvTiers::fetch(uint64_t hash, uint8_t* out) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (host_) {
      if (const uint8_t* d = host_->get(hash)) {
        std::memcpy(out, d, size_t(block_bytes_));
        ++host_hits_;
        return true;
      }
    }
  }
  if (!disk_ || !disk_->contains(hash)) return false;
  // The read runs unlocked: demotions go on meanwhile.
  const bool ok = disk_->read(hash, out);
  std::lock_guard<std::mutex> lock(mu_);
  if (!ok) {
    ++failures_;
    return false;
  }
  ++disk_hits_;
  if (host_) host_->put(hash, out);
  return true;
}

void KvTiers::prefetch(std::span<const uint64_t> hashes) {
  if (!disk_) return;
  std::vector<uint64_t> missing;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (uint64_t h : hashes) {
      if (!host_ || !host_->contains(h)) missing.push_back(h);
    }
  }
  disk_->prefetch(missing);
}

int32_t KvTiers::fetch_many(std::span<const uint64_t> hashes, uint8_t* out) {
  const size_t bb = size_t(block_bytes_);
  std::vector<uint64_t> from_disk;
  std::vector<size_t> disk_index;
  size_t n = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (; n < hashes.size(); ++n) {
      if (host_) {
        if (const uint8_t* d = host_->get(hashes[n])) {
          std::memcpy(out + n * bb, d, bb);
          ++host_hits_;
          continue;
        }
      }
      if (!disk_ || !disk_->contains(hashes[n])) break;
      from_disk.push_back(hashes[n]);
      disk_index.push_back(n);
    }
  }
  if (from_disk.empty()) return int32_t(n);
  // Straight into their places in `out` (the read runs unlocked).
  std::vector<uint8_t*> outs;
  for (size_t i : disk_index) outs.push_back(out + i * bb);
  std::vector<uint8_t> ok;
  disk_->read_many(from_disk, outs, ok);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t k = 0; k < from_disk.size(); ++k) {
    if (!ok[k]) {
      ++failures_;
      return int32_t(disk_index[k]);
    }
    ++disk_hits_;  // not copied up: the pool block these go to demotes to host memory when evicted
  }
  return int32_t(n);
}

bool KvTiers::flush(double timeout_s) { return !disk_ || disk_->flush(timeout_s); }

KvTierStats KvTiers::stats() const {
  KvTierStats s;
  s.enabled = true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (host_) {
      s.host_blocks = host_->n_blocks();
      s.host_bytes = host_->bytes();
      s.host_evictions = host_->evictions();
      s.host_pinned_evictions = host_->pinned_evictions();
    }
    s.demoted_blocks = demoted_;
    s.host_hit_blocks = host_hits_;
    s.disk_hit_blocks = disk_hits_;
    s.promote_failures = failures_;
    s.pinned_blocks = pinned_;
  }
  if (disk_) s.disk = disk_->stats();
  return s;
}

}  // namespace strata
