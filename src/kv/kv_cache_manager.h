// KvCacheManager: the block pool, the prefix index and an eviction policy as one allocator of
// block ids. It owns metadata only (model/kv_storage.h holds the bytes) and is driven by one
// thread, the engine's. Sequences hold references; a block whose last reference drops stays
// published (if it was) in an idle queue until a running sequence needs it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kv/block_pool.h"
#include "kv/eviction_policy.h"
#include "kv/prefix_index.h"

namespace strata {

struct KvCacheStats {
  int32_t n_blocks = 0;
  int32_t used = 0;       // referenced by at least one sequence
  int32_t free = 0;       // holding nothing
  int32_t cached = 0;     // idle, published, evictable
  int32_t pinned = 0;     // of `cached`: under a live session pin
  int64_t evictions = 0;  // cached blocks given to another use, since start
};

class KvCacheManager {
 public:
  KvCacheManager(int32_t n_blocks, int32_t block_size,
                 std::unique_ptr<EvictionPolicy> policy = make_default_eviction_policy());

  int32_t block_size() const { return pool_.block_size(); }
  int32_t n_blocks() const { return pool_.n_blocks(); }
  // Blocks an allocation can obtain right now: free ones plus evictable cached ones.
  int32_t n_available() const { return pool_.n_free() + pool_.n_idle(); }

  // Number of leading hashes whose blocks are cached (no references taken).
  int32_t count_cached(std::span<const uint64_t> block_hashes) const;
  // The blocks of the longest cached chain of `block_hashes`, each with a reference taken.
  std::vector<int32_t> acquire_cached(std::span<const uint64_t> block_hashes);

  // A block holding nothing, with one reference: from the free list, else by evicting the
  // policy's victim. -1 when every block is referenced.
  int32_t allocate(double now);

  // Publishes a full, referenced block under `hash`. False when another block already holds
  // that hash (the caller keeps its copy unpublished) or this block is already published.
  bool publish(int32_t block, uint64_t hash);

  // One more reference on each of `blocks`, each referenced already (a copy in flight keeps
  // it from being freed and reused); release() drops it.
  void retain(std::span<const int32_t> blocks);

  // Drops one reference on each block, last block first so that the tails of chains are evicted
  // before their heads. Published blocks whose count reaches zero go idle; a positive
  // `pin_until` (engine clock, s) pins them above ordinary LRU until then. Unpublished ones return
  // to the free list.
  void release(std::span<const int32_t> blocks, double now, double pin_until = 0.0);

  // Called with a published block and its hash when allocate() evicts it, before the block is
  // handed out (its bytes are still intact): the lower KV tiers copy it out here.
  void set_evict_hook(std::function<void(int32_t block, uint64_t hash)> hook) { evict_hook_ = std::move(hook); }

  KvCacheStats stats(double now) const;
  const BlockPool& pool() const { return pool_; }
  const PrefixIndex& index() const { return index_; }

 private:
  BlockPool pool_;
  PrefixIndex index_;
  std::unique_ptr<EvictionPolicy> policy_;
  int64_t evictions_ = 0;
  std::function<void(int32_t, uint64_t)> evict_hook_;
};

}  // namespace strata
