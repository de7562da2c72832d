#include "kv/eviction_policy.h"

namespace strata {

int32_t SessionLruPolicy::queue_for(const BlockMeta& meta, double now) const {
  return meta.pin_until > now ? kPinned : kOrdinary;
}

int32_t SessionLruPolicy::pick_victim(const BlockPool& pool, double now) const {
  const int32_t ordinary = pool.idle_front(kOrdinary);
  const int32_t pinned = pool.idle_front(kPinned);
  if (pinned >= 0 && pool.meta(pinned).pin_until <= now) {
    if (ordinary < 0 || pool.meta(pinned).idle_since <= pool.meta(ordinary).idle_since) return pinned;
  }
  return ordinary >= 0 ? ordinary : pinned;
}

std::unique_ptr<EvictionPolicy> make_default_eviction_policy() { return std::make_unique<SessionLruPolicy>(); }

}  // namespace strata
