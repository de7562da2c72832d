// BlockPool: the metadata of the paged KV cache's blocks, kept apart from their storage
// (model/kv_storage.h owns the bytes). Per block: a reference count, the chained prefix hash it
// is published under, links of the idle queue it waits in, and a session pin expiry. The pool
// only keeps lists; which idle queue a block joins and which block is evicted first belong to
// an EvictionPolicy (eviction_policy.h), and what a hash means to the PrefixIndex.
//
// A block is in exactly one of three places: the free list (holds nothing), in use
// (ref_count > 0) or an idle queue (ref_count == 0, published, evictable).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata {

struct BlockMeta {
  int32_t ref_count = 0;
  bool has_hash = false;
  uint64_t hash = 0;        // chained prefix hash while published
  int32_t prev = -1;        // idle queue links (towards the front = older)
  int32_t next = -1;
  int32_t queue = -1;       // idle queue holding the block, -1 when none
  double idle_since = 0.0;  // s (engine clock), when the block last became idle
  double pin_until = 0.0;   // s (engine clock), session pin expiry; 0: never pinned
};

class BlockPool {
 public:
  BlockPool(int32_t n_blocks, int32_t block_size, int32_t n_idle_queues);

  int32_t n_blocks() const { return int32_t(meta_.size()); }
  int32_t block_size() const { return block_size_; }
  const BlockMeta& meta(int32_t id) const;

  // Free list: blocks that hold nothing. pop_free returns -1 when empty.
  int32_t n_free() const { return int32_t(free_.size()); }
  int32_t pop_free();
  void push_free(int32_t id);

  // References held by sequences. drop_ref returns the count left.
  void add_ref(int32_t id);
  int32_t drop_ref(int32_t id);
  int32_t n_in_use() const { return n_in_use_; }

  void set_hash(int32_t id, uint64_t hash);
  void clear_hash(int32_t id);
  void extend_pin(int32_t id, double until);  // keeps the later of the two expiries

  // Idle queues: FIFO by the time a block became idle, oldest at the front.
  int32_t n_idle_queues() const { return int32_t(queue_front_.size()); }
  void push_idle(int32_t id, int32_t queue, double now);
  void remove_idle(int32_t id);
  int32_t idle_front(int32_t queue) const { return queue_front_[size_t(queue)]; }
  int32_t idle_next(int32_t id) const { return meta(id).next; }
  int32_t n_idle(int32_t queue) const { return queue_size_[size_t(queue)]; }
  int32_t n_idle() const;

 private:
  BlockMeta& at(int32_t id);

  int32_t block_size_;
  std::vector<BlockMeta> meta_;
  std::vector<int32_t> free_;  // stack; ids popped in ascending order at first
  std::vector<int32_t> queue_front_, queue_back_, queue_size_;
  int32_t n_in_use_ = 0;
};

}  // namespace strata
