// TierPromoter: brings a newly submitted sequence's prefix up from the lower KV tiers
// (kv/host/kv_tiers.h) without stalling the running batch.
//
// start() walks the prompt's block hashes: blocks the pool still caches are held (a reference
// taken, so no eviction takes them); for each block only the tiers have, while the chain lasts,
// a pool block is allocated, and a background thread takes the tiers' blocks in batches
// (KvTiers::fetch_batch): host-memory blocks are leased in place (no copy: the install reads
// their host slots, a device by DMA), disk blocks are read into host staging buffers (one large
// read per disk file and batch, the next batch prefetched), at most about kStagingBytes of them
// ahead of the engine. The sequence waits here, outside the scheduler, while other sequences
// keep stepping. poll() (engine thread, every loop) installs the batches into the pool through
// the executor (only the engine thread touches the executor and pool metadata) and returns the
// leases, and once the reads are done publishes the installed blocks under their hashes, frees
// the others (the chain ends there; the scheduler recomputes from that point) and hands the
// sequence to the scheduler, whose admission then finds the whole prefix in the pool. The
// references are dropped once the sequence has left the waiting state (it holds its own then)
// or ended.
//
// Models whose prefix hit needs more than the full-attention blocks (Companions: the
// sliding-window pool's blocks from the hit's window start, a recurrent-state snapshot at the
// hit, as the scheduler's admission asks) promote those too: start() picks the longest prefix
// whose full blocks and companions the pools and tiers hold together, the promotion thread
// reads the companions before the full blocks, and poll() installs and publishes them (window
// blocks held like the full ones, the snapshot put in the snapshot store) once the whole full
// chain is in.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kv/host/kv_tiers.h"
#include "kv/kv_cache_manager.h"
#include "kv/state_cache.h"
#include "runtime/sequence.h"

namespace strata {

// What a hit needs besides the full-attention blocks; every member null/0: nothing.
struct TierCompanions {
  KvCacheManager* window_kv = nullptr;  // the sliding-window pool
  KvTiers* window_tiers = nullptr;      // its lower tiers (null: only pool blocks count)
  int32_t window = 0;                   // tokens
  // Window-pool blocks `blocks` from bytes (block i at i * window_tiers->block_bytes()).
  std::function<void(std::span<const int32_t> blocks, const uint8_t* bytes)> install_window;
  StateSnapshotStore* snapshots = nullptr;  // recurrent state: a snapshot at the hit
  KvTiers* state_tiers = nullptr;           // snapshots' lower tiers (null: the store alone)
  int64_t state_floats = 0;
};

class TierPromoter {
 public:
  // install: a batch's blocks (block i's bytes at srcs[i]: a leased host slot or a staging
  // buffer) into pool blocks `blocks`, in one call so a device pool takes the batch in a few
  // large copies (StepExecutor::write_blocks_from); runs on the engine thread.
  using InstallFn = std::function<void(std::span<const int32_t> blocks, std::span<const uint8_t* const> srcs)>;
  // Disk blocks read, not yet installed, per job; read in batches of half this. The promotion
  // thread allocates and touches two batch buffers when it starts, kept for reuse: promotions
  // then write into resident pages, not fresh ones (a page fault costs microseconds). A batch
  // of 128 MiB keeps several disk reads in flight (DiskTier::read_many reads 16 MiB pieces,
  // four at a time).
  static constexpr int64_t kStagingBytes = int64_t(256) << 20;

  TierPromoter(KvCacheManager& kv, KvTiers& tiers, uint64_t prefix_salt, int64_t block_bytes, InstallFn install,
               TierCompanions companions = TierCompanions());
  // Finishes the read in progress and drops the rest (returning its leases).
  ~TierPromoter();
  TierPromoter(const TierPromoter&) = delete;
  TierPromoter& operator=(const TierPromoter&) = delete;

  // Starts promoting the tier part of a new sequence's cached prefix. True: `seq` waits here
  // until poll() returns it; false: nothing to promote, the caller schedules it now.
  bool start(Sequence* seq, double now);
  // Installs what was read; returns the sequences whose blocks are all in and published: ready
  // for the scheduler. Also drops the references of sequences handed over earlier that the
  // scheduler has admitted.
  std::vector<Sequence*> poll(double now);
  // `seq` ends (cancel, error, shutdown) in any state: its references go now, the blocks of its
  // read when the read stops (at the next poll()).
  void forget(const Sequence* seq, double now);

  int32_t in_flight() const;  // sequences whose blocks are not all in yet
  int64_t promoted_blocks() const { return promoted_blocks_; }

 private:
  struct Batch {
    std::vector<uint8_t> bytes;        // [disk blocks, block_bytes] read from disk
    std::vector<const uint8_t*> srcs;  // per block: its bytes (a leased host slot or in `bytes`)
    std::vector<uint8_t> leased;       // per block: srcs[i] is a host-tier lease
  };
  struct Job {
    const Sequence* seq = nullptr;  // null: the sequence ended meanwhile
    std::vector<uint64_t> hashes;   // tier blocks to copy, in chain order
    std::vector<int32_t> blocks;    // their pool blocks
    // Companions to read from their tiers (the promotion thread, before the full blocks):
    // window blocks and their window-pool blocks, the snapshot at state_pos (hash 0: none).
    std::vector<uint64_t> window_hashes;
    std::vector<int32_t> window_blocks;
    std::vector<uint8_t> window_bytes;
    uint64_t state_hash = 0;
    int32_t state_pos = 0;
    std::vector<float> state;
    bool companions_read = false;  // every companion read (set before `finished`)
    // Under mu_: batches taken by the promotion thread, not yet installed; their disk blocks
    // (staging bytes); reads done.
    std::deque<Batch> staged;
    size_t staged_blocks = 0;
    bool finished = false;
    // Engine thread: leading blocks installed; an install threw.
    int32_t n_installed = 0;
    bool failed = false;
    // For the log line of a large promotion: when start() began, its seconds (allocations and
    // the demotions they cause), the installs' seconds, when the first install began, blocks
    // leased from host memory.
    std::chrono::steady_clock::time_point t_start;
    double start_s = 0.0, install_s = 0.0, first_install_s = 0.0;
    int64_t host_blocks = 0;
  };
  struct Hold {
    Sequence* seq = nullptr;
    std::vector<int32_t> blocks;  // references this promoter took
    std::vector<int32_t> window_blocks;  // the same in the window pool
    bool handed_over = false;     // returned by poll()
  };
  void worker_loop();
  void release_leases(Batch& b);
  // Whether a hit of n blocks has its companions in the pools or tiers.
  bool companions_at(std::span<const uint64_t> hashes, int32_t n) const;
  void release_hold(Hold& h, double now);
  // A finished job's companions into the window pool and the snapshot store (poll()).
  void install_companions(Job& j, Hold& hold, double now);
  bool has_companions() const { return companions_.window_kv != nullptr || companions_.snapshots != nullptr; }

  KvCacheManager& kv_;
  KvTiers& tiers_;
  uint64_t salt_;
  int64_t block_bytes_;
  size_t max_staged_;  // blocks
  InstallFn install_;
  TierCompanions companions_;
  std::unordered_map<uint64_t, Hold> holds_;  // by Sequence::id (engine thread only)
  std::vector<std::unique_ptr<Job>> jobs_;    // engine thread owns them; the worker reads via queue_
  int64_t promoted_blocks_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;        // work queued, or stop
  std::condition_variable space_cv_;  // staging drained, a job forgotten, or stop
  std::deque<Job*> queue_;            // waiting for the promotion thread
  std::vector<std::vector<uint8_t>> spare_;  // installed batches' buffers, reused (no page faults)
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace strata
