#include "kv/block_pool.h"

#include <algorithm>

#include "core/check.h"

namespace strata {

BlockPool::BlockPool(int32_t n_blocks, int32_t block_size, int32_t n_idle_queues)
    : block_size_(block_size),
      meta_(size_t(std::max(n_blocks, 0))),
      queue_front_(size_t(n_idle_queues), -1),
      queue_back_(size_t(n_idle_queues), -1),
      queue_size_(size_t(n_idle_queues), 0) {
  STRATA_CHECK(n_blocks > 0 && block_size > 0 && n_idle_queues > 0, "block pool needs blocks and a queue");
  free_.reserve(size_t(n_blocks));
  for (int32_t id = n_blocks - 1; id >= 0; --id) free_.push_back(id);
}

const BlockMeta& BlockPool::meta(int32_t id) const {
  STRATA_CHECK(id >= 0 && id < n_blocks(), "block id " + std::to_string(id) + " out of range");
  return meta_[size_t(id)];
}

BlockMeta& BlockPool::at(int32_t id) {
  STRATA_CHECK(id >= 0 && id < n_blocks(), "block id " + std::to_string(id) + " out of range");
  return meta_[size_t(id)];
}

int32_t BlockPool::pop_free() {
  if (free_.empty()) return -1;
  const int32_t id = free_.back();
  free_.pop_back();
  return id;
}

void BlockPool::push_free(int32_t id) {
  BlockMeta& m = at(id);
  STRATA_CHECK(m.ref_count == 0 && !m.has_hash && m.queue < 0, "only an empty, unreferenced block can be freed");
  m.pin_until = 0.0;
  free_.push_back(id);
}

void BlockPool::add_ref(int32_t id) {
  BlockMeta& m = at(id);
  STRATA_CHECK(m.queue < 0, "a referenced block cannot sit in an idle queue");
  if (m.ref_count++ == 0) ++n_in_use_;
}

int32_t BlockPool::drop_ref(int32_t id) {
  BlockMeta& m = at(id);
  STRATA_CHECK(m.ref_count > 0, "block " + std::to_string(id) + " released more often than taken");
  if (--m.ref_count == 0) --n_in_use_;
  return m.ref_count;
}

void BlockPool::set_hash(int32_t id, uint64_t hash) {
  BlockMeta& m = at(id);
  m.has_hash = true;
  m.hash = hash;
}

void BlockPool::clear_hash(int32_t id) {
  BlockMeta& m = at(id);
  m.has_hash = false;
  m.hash = 0;
}

void BlockPool::extend_pin(int32_t id, double until) {
  BlockMeta& m = at(id);
  m.pin_until = std::max(m.pin_until, until);
}

void BlockPool::push_idle(int32_t id, int32_t queue, double now) {
  BlockMeta& m = at(id);
  STRATA_CHECK(m.ref_count == 0 && m.queue < 0, "only an unreferenced block can become idle");
  STRATA_CHECK(queue >= 0 && queue < n_idle_queues(), "idle queue out of range");
  const size_t q = size_t(queue);
  m.queue = queue;
  m.idle_since = now;
  m.next = -1;
  m.prev = queue_back_[q];
  if (m.prev >= 0) meta_[size_t(m.prev)].next = id; else queue_front_[q] = id;
  queue_back_[q] = id;
  ++queue_size_[q];
}

void BlockPool::remove_idle(int32_t id) {
  BlockMeta& m = at(id);
  STRATA_CHECK(m.queue >= 0, "block " + std::to_string(id) + " is not idle");
  const size_t q = size_t(m.queue);
  if (m.prev >= 0) meta_[size_t(m.prev)].next = m.next; else queue_front_[q] = m.next;
  if (m.next >= 0) meta_[size_t(m.next)].prev = m.prev; else queue_back_[q] = m.prev;
  --queue_size_[q];
  m.prev = m.next = -1;
  m.queue = -1;
}

int32_t BlockPool::n_idle() const {
  int32_t n = 0;
  for (int32_t s : queue_size_) n += s;
  return n;
}

}  // namespace strata
