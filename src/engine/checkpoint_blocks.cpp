#include "engine/checkpoint_blocks.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>

#include "core/log.h"

namespace strata {

namespace {
constexpr size_t kPage = 4096;
}  // namespace

CheckpointBlocks::CheckpointBlocks(StepExecutor& exec, KvCacheManager& kv, std::function<double()> clock, DiskTier& disk,
                                   int64_t block_bytes, int64_t staging_bytes, OnDropped on_dropped)
    : exec_(exec), kv_(kv), clock_(std::move(clock)), disk_(disk), block_bytes_(block_bytes),
      on_dropped_(std::move(on_dropped)) {
  if (block_bytes <= 0) throw std::invalid_argument("checkpoint staging: block_bytes must be > 0");
  const int64_t n_slots = std::max<int64_t>(1, staging_bytes / block_bytes);
  memory_bytes_ = (size_t(n_slots) * size_t(block_bytes) + kPage - 1) / kPage * kPage;
  memory_ = static_cast<uint8_t*>(std::aligned_alloc(kPage, memory_bytes_));
  if (memory_ == nullptr) throw std::bad_alloc();
  registered_ = exec_.register_host_memory(memory_, memory_bytes_);
  free_.reserve(size_t(n_slots));
  for (int64_t s = n_slots - 1; s >= 0; --s) free_.push_back(int32_t(s));
}

CheckpointBlocks::~CheckpointBlocks() {
  if (!adding_.empty()) {
    Batch b;
    b.entries = std::move(adding_);
    release(b);
  }
  // The device must be done writing the staging before it is freed; the blocks are not handed
  // over (the disk tier may be gone: settle(true) first to keep them).
  for (const Batch& b : in_flight_) {
    try {
      if (b.ticket != 0) exec_.reads_landed(b.ticket, true);
    } catch (const std::exception& e) {
      log::warn("checkpoint blocks: {}", e.what());
    }
  }
  if (registered_) exec_.unregister_host_memory(memory_);
  std::free(memory_);
}

bool CheckpointBlocks::add(uint64_t seq_id, int32_t index, int32_t block, uint64_t hash) {
  int32_t slot = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    }
  }
  if (slot < 0) {
    ++stats_.deferred;
    return false;
  }
  // The reference is taken now, while the sequence holds the block: by issue() it may have
  // finished or been preempted, and the block been given to another sequence.
  const int32_t ids[1] = {block};
  kv_.retain(ids);
  adding_.push_back(Entry{seq_id, index, block, hash, slot});
  return true;
}

void CheckpointBlocks::issue() {
  if (adding_.empty()) return;
  Batch b;
  b.entries = std::move(adding_);
  adding_.clear();
  std::vector<int32_t> blocks;
  std::vector<uint8_t*> places;
  blocks.reserve(b.entries.size());
  places.reserve(b.entries.size());
  for (const Entry& e : b.entries) {
    blocks.push_back(e.block);
    places.push_back(slot_bytes(e.slot));
  }
  try {
    b.ticket = exec_.read_held_blocks_to_async(blocks, places);
  } catch (...) {
    release(b);
    for (const Entry& e : b.entries) give_back(e.slot);
    throw;
  }
  stats_.staged += int64_t(b.entries.size());
  in_flight_.push_back(std::move(b));
}

void CheckpointBlocks::settle(bool wait) {
  while (!in_flight_.empty()) {
    Batch& b = in_flight_.front();
    bool landed = true;
    try {
      landed = b.ticket == 0 || exec_.reads_landed(b.ticket, wait);
    } catch (...) {
      // The copy failed: its slots hold nothing; the sequences hand the blocks over again.
      Batch failed = std::move(b);
      in_flight_.pop_front();
      release(failed);
      for (const Entry& e : failed.entries) {
        give_back(e.slot);
        if (on_dropped_) on_dropped_(e.seq_id, e.index);
      }
      throw;
    }
    if (!landed) return;
    release(b);
    for (const Entry& e : b.entries) {
      const int32_t slot = e.slot;
      if (disk_.enqueue_ref(e.hash, slot_bytes(slot), [this, slot] { give_back(slot); })) {
        ++stats_.handed;
      } else {
        ++stats_.dropped;
        if (on_dropped_) on_dropped_(e.seq_id, e.index);
      }
    }
    in_flight_.pop_front();
  }
}

void CheckpointBlocks::release(const Batch& b) {
  std::vector<int32_t> blocks;
  blocks.reserve(b.entries.size());
  for (const Entry& e : b.entries) blocks.push_back(e.block);
  kv_.release(blocks, clock_());
}

void CheckpointBlocks::give_back(int32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(slot);
}

CheckpointBlockStats CheckpointBlocks::stats() const { return stats_; }

}  // namespace strata
