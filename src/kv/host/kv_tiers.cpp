#include "kv/host/kv_tiers.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "core/log.h"

namespace strata {

KvTiers::KvTiers(int64_t block_bytes, int64_t host_bytes, std::unique_ptr<DiskTier> disk,
                 std::unique_ptr<RedisTier> redis)
    : block_bytes_(block_bytes),
      host_(host_bytes > 0 ? std::make_unique<HostTier>(host_bytes, size_t(block_bytes)) : nullptr),
      disk_(std::move(disk)),
      redis_(std::move(redis)) {}

KvTiers::~KvTiers() {
  settle(true);  // copies in flight write into the slab
  disk_.reset();
  redis_.reset();
}

int32_t KvTiers::count_remote(std::span<const uint64_t> hashes) {
  return redis_ ? redis_->count_prefix(hashes) : 0;
}

void KvTiers::share(uint64_t hash, const uint8_t* data) {
  if (redis_) redis_->enqueue(hash, data);
}

void KvTiers::defer_commit(std::vector<uint64_t> hashes, std::vector<uint8_t*> slots, std::function<bool(bool)> landed) {
  std::lock_guard<std::mutex> lock(deferred_mu_);
  deferred_.push_back(Deferred{std::move(hashes), std::move(slots), std::move(landed)});
}

void KvTiers::settle(bool wait) {
  std::lock_guard<std::mutex> lock(deferred_mu_);
  while (!deferred_.empty()) {
    Deferred& d = deferred_.front();
    bool ok = true;
    try {
      if (!d.landed(wait)) break;
    } catch (const std::exception& e) {
      log::warn("KV host tier: {} demoted blocks lost, their copy failed: {}", d.hashes.size(), e.what());
      ok = false;
    }
    if (ok) {
      commit_demotions(d.hashes, d.slots);
    } else {
      cancel_demotions(d.slots);
    }
    deferred_.pop_front();
  }
}

int64_t KvTiers::unsettled() const {
  std::lock_guard<std::mutex> lock(deferred_mu_);
  return int64_t(deferred_.size());
}

std::span<uint8_t> KvTiers::host_memory() const {
  if (!host_ || host_->slab() == nullptr) return {};
  return {host_->slab(), host_->slab_bytes()};
}

void KvTiers::queue_disk_from_host(std::span<const uint64_t> hashes, std::span<const uint8_t* const> leased) {
  for (size_t i = 0; i < hashes.size(); ++i) {
    const uint8_t* p = leased[i];
    bool by_ref = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // The writer's own backlog counts, not a promotion's leases (short, and taken while
      // the demotions that made room for it are queued here: a copy each would stall them).
      by_ref = disk_ref_slots_ < host_->n_slots() / 4;
      if (by_ref) ++disk_ref_slots_;
    }
    if (by_ref) {
      disk_->enqueue_ref(hashes[i], p, [this, p] {
        std::lock_guard<std::mutex> lock(mu_);
        --disk_ref_slots_;
        host_->release(p);
      });
      continue;
    }
    disk_->enqueue(hashes[i], p);
    std::lock_guard<std::mutex> lock(mu_);
    host_->release(p);
  }
}

void KvTiers::reserve_demotions(std::span<const uint64_t> hashes, std::vector<uint8_t*>& slots,
                                std::vector<uint8_t>& present) {
  slots.assign(hashes.size(), nullptr);
  present.assign(hashes.size(), 0);
  std::vector<uint64_t> to_disk;
  std::vector<const uint8_t*> leases;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!host_) return;
    for (size_t i = 0; i < hashes.size(); ++i) {
      if (host_->contains(hashes[i])) {
        present[i] = 1;
        ++demoted_;
        ++demote_skipped_;
        if (disk_ && !disk_->contains(hashes[i])) {
          to_disk.push_back(hashes[i]);
          leases.push_back(host_->lease(hashes[i]));
        } else {
          host_->get(hashes[i]);  // most recently used
        }
        continue;
      }
      slots[i] = host_->reserve(hashes[i]);
    }
  }
  if (disk_) queue_disk_from_host(to_disk, leases);
}

void KvTiers::commit_demotions(std::span<const uint64_t> hashes, std::span<uint8_t* const> slots) {
  std::vector<uint64_t> to_disk;
  std::vector<const uint8_t*> leases;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < hashes.size(); ++i) {
      if (slots[i] == nullptr) continue;
      ++demoted_;
      if (redis_) redis_->enqueue(hashes[i], slots[i]);  // a copy, before the slot is shared
      host_->commit(hashes[i], slots[i]);
      if (disk_) {
        to_disk.push_back(hashes[i]);
        leases.push_back(host_->lease(hashes[i]));
      }
    }
  }
  if (disk_) queue_disk_from_host(to_disk, leases);
}

void KvTiers::cancel_demotions(std::span<uint8_t* const> slots) {
  std::lock_guard<std::mutex> lock(mu_);
  for (uint8_t* s : slots) {
    if (s != nullptr) host_->cancel(s);
  }
}

void KvTiers::release(std::span<const uint8_t* const> slots) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const uint8_t* s : slots) host_->release(s);
}

int32_t KvTiers::fetch_batch(std::span<const uint64_t> hashes, int32_t max_disk, uint8_t* buf,
                             std::vector<const uint8_t*>& srcs, std::vector<uint8_t>& leased) {
  const size_t bb = size_t(block_bytes_);
  srcs.clear();
  leased.clear();
  std::vector<uint64_t> from_disk, from_redis;
  std::vector<size_t> disk_index, redis_index;
  std::vector<uint8_t*> outs, redis_outs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t n = 0; n < hashes.size(); ++n) {
      if (host_) {
        if (const uint8_t* d = host_->lease(hashes[n])) {
          srcs.push_back(d);
          leased.push_back(1);
          ++host_hits_;
          continue;
        }
      }
      const int32_t staged = int32_t(from_disk.size() + from_redis.size());
      if (staged >= max_disk) break;
      uint8_t* out = buf + size_t(staged) * bb;
      if (disk_ && disk_->contains(hashes[n])) {
        outs.push_back(out);
        from_disk.push_back(hashes[n]);
        disk_index.push_back(n);
      } else if (redis_) {
        redis_outs.push_back(out);
        from_redis.push_back(hashes[n]);
        redis_index.push_back(n);
      } else {
        break;
      }
      srcs.push_back(out);
      leased.push_back(0);
    }
  }
  size_t n = srcs.size();
  if (!from_disk.empty() || !from_redis.empty()) {
    std::vector<uint8_t> ok, redis_ok;
    if (!from_disk.empty()) disk_->read_many(from_disk, outs, ok);  // unlocked: demotions go on meanwhile
    if (!from_redis.empty()) redis_->read_many(from_redis, redis_outs, redis_ok);
    std::lock_guard<std::mutex> lock(mu_);
    // The chain ends at the first block either tier could not serve.
    for (size_t k = 0; k < from_disk.size(); ++k) {
      if (!ok[k]) {
        ++failures_;
        n = std::min(n, disk_index[k]);
        break;
      }
    }
    for (size_t k = 0; k < from_redis.size(); ++k) {
      if (!redis_ok[k]) {
        ++failures_;
        n = std::min(n, redis_index[k]);
        break;
      }
    }
    // Not copied up: the pool block these go to demotes to host memory when evicted.
    for (size_t k = 0; k < from_disk.size() && disk_index[k] < n; ++k) ++disk_hits_;
    for (size_t k = 0; k < from_redis.size() && redis_index[k] < n; ++k) ++redis_hits_;
    // Blocks past a failed read are not used: their leases go back.
    for (size_t i = n; i < srcs.size(); ++i) {
      if (leased[i]) {
        host_->release(srcs[i]);
        --host_hits_;
      }
    }
  }
  srcs.resize(n);
  leased.resize(n);
  return int32_t(n);
}

void KvTiers::demote(uint64_t hash, const uint8_t* data) {
  const uint8_t* leased = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++demoted_;
    if (host_) {
      host_->put(hash, data);
      if (disk_) leased = host_->lease(hash);  // the disk writer reads the host copy
    }
  }
  if (redis_) redis_->enqueue(hash, data);
  if (!disk_) return;
  if (leased != nullptr) {
    queue_disk_from_host(std::span<const uint64_t>(&hash, 1), std::span<const uint8_t* const>(&leased, 1));
  } else {
    disk_->enqueue(hash, data);
  }
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

bool KvTiers::flush(double timeout_s) {
  settle(true);
  const bool disk_done = !disk_ || disk_->flush(timeout_s);
  return (!redis_ || redis_->flush(timeout_s)) && disk_done;
}

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
    s.demote_copies_skipped = demote_skipped_;
    s.host_hit_blocks = host_hits_;
    s.disk_hit_blocks = disk_hits_;
    s.promote_failures = failures_;
    s.pinned_blocks = pinned_;
    s.redis_hit_blocks = redis_hits_;
  }
  if (disk_) s.disk = disk_->stats();
  if (redis_) s.redis = redis_->stats();
  return s;
}

}  // namespace strata
