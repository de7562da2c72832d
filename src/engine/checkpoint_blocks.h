// CheckpointBlocks: the KV blocks a generation checkpoint hands to the disk tier, copied off
// the executor's pool without waiting for the step in flight. A checkpoint takes a slot of a
// fixed staging area per new full block (add()); the step's blocks are read together behind
// the device's queue (issue(): StepExecutor::read_held_blocks_to_async, one transfer; a device
// copies straight into the staging, which is registered with it), each holding a reference on
// its block until then (so no step waits for the reads: no step writes a held block, and a
// finished sequence's blocks stay out of reuse); once their bytes have landed
// (settle()) each slot goes to the disk tier by reference (DiskTier::enqueue_ref) and comes
// back when the writer thread has written it. With every slot taken a checkpoint hands over
// fewer blocks (the next one carries on); a block the disk tier drops (its queue full) is
// reported to `on_dropped` so its sequence hands it over again.
//
// Threads: every call comes from the engine's thread; the disk writer gives slots back from its
// own.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <span>
#include <vector>

#include "engine/request.h"
#include "kv/disk/disk_tier.h"
#include "kv/kv_cache_manager.h"
#include "runtime/step_executor.h"

namespace strata {

class CheckpointBlocks {
 public:
  // Where a block the disk tier dropped came from: the sequence id and the block's index in it.
  using OnDropped = std::function<void(uint64_t seq_id, int32_t index)>;

  // clock: the engine's (KvCacheManager::release).
  CheckpointBlocks(StepExecutor& exec, KvCacheManager& kv, std::function<double()> clock, DiskTier& disk,
                   int64_t block_bytes, int64_t staging_bytes, OnDropped on_dropped);
  // Waits for the reads in flight (their blocks are not handed over: settle(true) first). The
  // disk tier, which reads the slots it was handed, must be gone or flushed before this is.
  ~CheckpointBlocks();
  CheckpointBlocks(const CheckpointBlocks&) = delete;
  CheckpointBlocks& operator=(const CheckpointBlocks&) = delete;

  // Block `block` (index `index` of sequence seq_id, published under `hash`, held by that
  // sequence now) joins the next issue(), holding a reference from here until its read has
  // landed. False: every slot is taken (counted as deferred).
  bool add(uint64_t seq_id, int32_t index, int32_t block, uint64_t hash);
  // Queues the reads of the blocks added since the last call, behind every step queued so far;
  // no later step writes them (each holds its reference from add()).
  void issue();
  // Hands the blocks whose bytes have landed to the disk tier; wait: every one issued.
  void settle(bool wait);
  CheckpointBlockStats stats() const;

 private:
  struct Entry {
    uint64_t seq_id = 0;
    int32_t index = 0;
    int32_t block = 0;
    uint64_t hash = 0;
    int32_t slot = 0;
  };
  struct Batch {
    uint64_t ticket = 0;  // StepExecutor::read_held_blocks_to_async's; 0: landed
    std::vector<Entry> entries;
  };
  uint8_t* slot_bytes(int32_t slot) const { return memory_ + size_t(slot) * size_t(block_bytes_); }
  void give_back(int32_t slot);
  void release(const Batch& b);  // the references issue() took

  StepExecutor& exec_;
  KvCacheManager& kv_;
  std::function<double()> clock_;
  DiskTier& disk_;
  const int64_t block_bytes_;
  OnDropped on_dropped_;
  uint8_t* memory_ = nullptr;  // [n_slots, block_bytes], page-aligned
  size_t memory_bytes_ = 0;
  bool registered_ = false;    // with the executor (a device copies into it directly)
  std::vector<Entry> adding_;  // added since the last issue()
  std::deque<Batch> in_flight_;
  CheckpointBlockStats stats_;
  mutable std::mutex mu_;      // free_: the disk writer gives slots back
  std::vector<int32_t> free_;
};

}  // namespace strata
