// EvictionPolicy: which cached idle block goes first when a running sequence needs one.
// The block pool only keeps idle queues; a policy decides which queue a block joins when its
// last reference drops and which block to evict. Running requests always come first: a policy
// orders evictions, it never refuses one while any idle block is left.
#pragma once

#include <cstdint>
#include <memory>

#include "kv/block_pool.h"

namespace strata {

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual int32_t n_queues() const = 0;
  // Queue an unreferenced published block joins.
  virtual int32_t queue_for(const BlockMeta& meta, double now) const = 0;
  // The idle block to evict next, -1 when no block is idle.
  virtual int32_t pick_victim(const BlockPool& pool, double now) const = 0;
};

// Least recently used first, with session pins above it: queue 0 holds ordinary blocks, queue 1
// blocks whose session pin had not expired when they became idle. A pinned block whose pin has
// since expired competes with ordinary blocks by idle time; live pins go last, earliest expiry
// (= oldest, one TTL for all sessions) first.
class SessionLruPolicy final : public EvictionPolicy {
 public:
  static constexpr int32_t kOrdinary = 0;
  static constexpr int32_t kPinned = 1;

  int32_t n_queues() const override { return 2; }
  int32_t queue_for(const BlockMeta& meta, double now) const override;
  int32_t pick_victim(const BlockPool& pool, double now) const override;
};

std::unique_ptr<EvictionPolicy> make_default_eviction_policy();

}  // namespace strata
