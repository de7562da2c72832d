#include "kv/kv_cache_manager.h"

#include "core/check.h"

namespace strata {

KvCacheManager::KvCacheManager(int32_t n_blocks, int32_t block_size, std::unique_ptr<EvictionPolicy> policy)
    : pool_(n_blocks, block_size, policy ? policy->n_queues() : 1), policy_(std::move(policy)) {
  STRATA_CHECK(policy_ != nullptr, "KvCacheManager needs an eviction policy");
}

int32_t KvCacheManager::count_cached(std::span<const uint64_t> block_hashes) const {
  int32_t n = 0;
  for (uint64_t h : block_hashes) {
    if (index_.find(h) < 0) break;
    ++n;
  }
  return n;
}

std::vector<int32_t> KvCacheManager::acquire_cached(std::span<const uint64_t> block_hashes) {
  std::vector<int32_t> blocks;
  for (uint64_t h : block_hashes) {
    const int32_t id = index_.find(h);
    if (id < 0) break;
    if (pool_.meta(id).queue >= 0) pool_.remove_idle(id);
    pool_.add_ref(id);
    blocks.push_back(id);
  }
  return blocks;
}

void KvCacheManager::retain(std::span<const int32_t> blocks) {
  for (int32_t id : blocks) {
    STRATA_CHECK(pool_.meta(id).ref_count > 0, "retain() of block " + std::to_string(id) + ", which nothing references");
    pool_.add_ref(id);
  }
}

int32_t KvCacheManager::allocate(double now) {
  int32_t id = pool_.pop_free();
  if (id < 0) {
    id = policy_->pick_victim(pool_, now);
    if (id < 0) return -1;
    pool_.remove_idle(id);
    const BlockMeta& m = pool_.meta(id);
    STRATA_CHECK(m.has_hash, "an idle block must be published");
    if (evict_hook_) evict_hook_(id, m.hash);
    index_.erase(m.hash, id);
    pool_.clear_hash(id);
    ++evictions_;
  }
  pool_.add_ref(id);
  return id;
}

bool KvCacheManager::publish(int32_t block, uint64_t hash) {
  const BlockMeta& m = pool_.meta(block);
  STRATA_CHECK(m.ref_count > 0, "only a referenced block can be published");
  if (m.has_hash) return false;
  if (!index_.insert(hash, block)) return false;
  pool_.set_hash(block, hash);
  return true;
}

void KvCacheManager::release(std::span<const int32_t> blocks, double now, double pin_until) {
  for (size_t i = blocks.size(); i-- > 0;) {
    const int32_t id = blocks[i];
    const bool published = pool_.meta(id).has_hash;
    if (published && pin_until > 0.0) pool_.extend_pin(id, pin_until);
    if (pool_.drop_ref(id) > 0) continue;
    if (published) {
      pool_.push_idle(id, policy_->queue_for(pool_.meta(id), now), now);
    } else {
      pool_.push_free(id);
    }
  }
}

KvCacheStats KvCacheManager::stats(double now) const {
  KvCacheStats s;
  s.n_blocks = pool_.n_blocks();
  s.used = pool_.n_in_use();
  s.free = pool_.n_free();
  s.cached = pool_.n_idle();
  for (int32_t q = 0; q < pool_.n_idle_queues(); ++q) {
    for (int32_t id = pool_.idle_front(q); id >= 0; id = pool_.idle_next(id)) {
      if (pool_.meta(id).pin_until > now) ++s.pinned;
    }
  }
  s.evictions = evictions_;
  return s;
}

}  // namespace strata
