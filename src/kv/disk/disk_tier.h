// DiskTier: the lowest KV tier, files of KV blocks in a directory that survive restarts.
//
// A file holds a group of blocks written together by the background writer:
//   header: magic "STRKVBLK", u32 format version, u32 identity length + identity string (model
//           namespace, KV codecs, block size and layer layout: everything that makes two
//           blocks with one hash interchangeable), u32 tensor count + u64 bytes per tensor
//           (the layer layout of one block: K then V of every full-attention layer owning KV),
//           u32 block count + u64 chained prefix hash per block (the token-hash chain), u64
//           xxh3 of the header so far;
//   data:   per block, per tensor: the tensor's bytes, then their u64 xxh3.
// Files are written under a temporary name, fsynced, renamed and the directory fsynced, so a
// file either exists whole or not at all. Names carry a write sequence number: on startup the
// index is rebuilt from the directory (oldest first) and writing continues after the newest.
// A file whose header, identity, version, layout or size is wrong (found at startup) or whose
// tensor checksum fails (found at read) is moved to quarantine/ with a log line; its blocks are
// simply misses. Over the byte budget, the least recently used files are deleted (a read or a
// repeated demotion of one of its blocks uses a file; at startup, files count as used in write
// order). Session pins (pin()) exempt a file holding a pinned block until the pin expires (the
// writer puts pinned and unpinned blocks in separate files):
// unpinned files go first, pinned ones only when nothing else is left over the budget. Pins
// survive a restart: the writer thread keeps them in `session_pins.bin` in the directory
// (expiries in wall-clock time, a checksum, written to a temporary name, fsynced and renamed)
// after each change, and open() loads the ones not yet expired. A damaged pins file is moved to
// quarantine/ like a damaged block file; its pins are lost, its blocks are not.
//
// Demotion goes through enqueue(): a queue capped in bytes feeds the writer thread; what does
// not fit is dropped and counted. enqueue_ref() queues a block without copying it: the writer
// reads the caller's bytes (a leased host-tier slot) and says when it is done with them. All
// methods are thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/log.h"
#include "core/status.h"

namespace strata {

struct DiskTierOptions {
  std::filesystem::path dir;
  int64_t max_bytes = int64_t(4) << 30;        // files in the directory, all together
  int64_t queue_bytes = int64_t(256) << 20;    // writer queue cap; past it demotions are dropped
  int64_t ref_queue_bytes = int64_t(2) << 30;  // the same for blocks queued by reference (enqueue_ref)
  int32_t max_group_blocks = 64;               // blocks per file at most
  // The writer waits this long for a group to fill before writing a short one: fewer, larger
  // files, which read back in fewer device requests.
  double group_wait_s = 0.01;
  std::string identity;                        // must match for a file to be loaded
  std::vector<int64_t> tensor_bytes;           // one block's tensors, in order
  double read_delay_s = 0.0;                   // > 0: each read sleeps this long (a slow device, for tests)
};

struct DiskTierStats {
  int64_t files = 0;
  int64_t bytes = 0;
  int64_t blocks = 0;          // indexed
  int64_t written_blocks = 0;  // since start
  int64_t dropped_blocks = 0;  // queue full
  int64_t queued_bytes = 0;
  int64_t evicted_files = 0;   // budget
  int64_t quarantined_files = 0;
  int64_t read_blocks = 0;
  int64_t read_file_bytes = 0;  // bytes read from tier files (blocks with checksums, alignment)
  int64_t write_errors = 0;
  int64_t pinned_evicted_files = 0;  // budget, with every file left pinned
};

class DiskTier {
 public:
  static constexpr uint32_t kFormatVersion = 1;

  // Creates the directory, removes stale temporary files, rebuilds the index from the files
  // there (quarantining bad ones) and starts the writer thread. An error names the directory.
  static Result<std::unique_ptr<DiskTier>> open(DiskTierOptions options);
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  int64_t block_bytes() const { return block_bytes_; }
  bool contains(uint64_t hash) const;
  // Queues one block (block_bytes() bytes) for writing. False when it was dropped (queue full);
  // true also when the block is already on disk or queued.
  bool enqueue(uint64_t hash, const uint8_t* data);
  // As enqueue(), reading `data` in place: it must stay unchanged until `done` is called, which
  // happens once in every case (at once, on the caller's thread, when the block is not kept:
  // already on disk or queued, or dropped; else on the writer thread after the write), with no
  // lock of this tier held. Capped by ref_queue_bytes.
  bool enqueue_ref(uint64_t hash, const uint8_t* data, std::function<void()> done);
  // Reads a block into `out` (block_bytes() bytes). False on a miss; a checksum failure or
  // an unreadable file quarantines the file and is a miss.
  bool read(uint64_t hash, uint8_t* out);
  // Reads several blocks, block i into outs[i] (block_bytes() bytes each): one pread per file
  // covering all of its blocks asked for (large sequential reads instead of one per block).
  // ok[i] says whether block i was read; misses and failures as read(). Calls run one at a time.
  void read_many(std::span<const uint64_t> hashes, std::span<uint8_t* const> outs, std::vector<uint8_t>& ok);
  // Asks the kernel to start reading the blocks of `hashes` that are on disk (readahead of each
  // file's range holding them), so the read() calls that follow find them in memory instead of
  // waiting for one device read each.
  void prefetch(std::span<const uint64_t> hashes);
  // Exempts the file holding `hash` (now or once written) from budget eviction until `until`
  // (tier_clock_s(), kv/host/host_tier.h); keeps the later expiry.
  void pin(uint64_t hash, double until);
  // Waits until the queue is written, at most `timeout_s`. False when the deadline passed first.
  bool flush(double timeout_s);
  DiskTierStats stats() const;
  const std::filesystem::path& dir() const { return options_.dir; }

 private:
  struct FileEntry {
    std::filesystem::path path;
    int64_t bytes = 0;
    std::vector<uint64_t> hashes;
    int64_t data_offset = 0;  // first block's data
    uint64_t last_use = 0;    // use_tick_ of its latest use
  };
  struct Loc {
    uint64_t seq = 0;   // file
    int32_t index = 0;  // block within the file
  };
  struct Pending {
    uint64_t hash = 0;
    std::vector<uint8_t> data;
    const uint8_t* ref = nullptr;  // enqueue_ref(): the bytes are here instead of in `data`
    std::function<void()> done;
    const uint8_t* bytes() const { return ref != nullptr ? ref : data.data(); }
  };

  explicit DiskTier(DiskTierOptions options);
  Status scan();
  // Parses and checks a file's header; the reason it is rejected, else empty.
  std::string load_header(const std::filesystem::path& path, FileEntry& entry) const;
  void quarantine_locked(uint64_t seq, const std::string& reason);
  void quarantine_path(const std::filesystem::path& path, const std::string& reason);
  void add_file_locked(uint64_t seq, FileEntry entry);
  // Checks the checksums of one block's data + checksums at `in` (stride() bytes) and copies its
  // data to `out`; the reason it failed, else empty.
  std::string unpack_block(const uint8_t* in, uint8_t* out, uint64_t hash) const;
  void remove_file_locked(uint64_t seq);
  // Drops least recently used files from the index until the budget holds; returns their
  // paths, which the caller unlinks without holding mu_ (an unlink on a busy disk takes
  // milliseconds, and the engine's thread takes mu_ to hand blocks over).
  [[nodiscard]] std::vector<std::filesystem::path> enforce_budget_locked();
  bool file_pinned_locked(const FileEntry& f, double now) const;
  void writer_loop();
  bool write_group(uint64_t seq, const std::vector<Pending>& group, FileEntry& entry);
  // session_pins.bin: load_pins_locked() at open, write_pins() from the writer thread.
  void load_pins_locked();
  bool write_pins(const std::vector<std::pair<uint64_t, double>>& pins) const;
  int64_t stride() const;  // bytes of one block in a file (data + checksums)

  DiskTierOptions options_;
  int64_t block_bytes_ = 0;
  mutable std::mutex mu_;
  std::mutex read_mu_;            // read_many() and its buffers, kept between calls (no page faults)
  log::Throttle failure_log_;     // failed writes: a line at most every 10 s
  static constexpr size_t kReadsInFlight = 4;  // read_many's concurrent reads
  std::vector<uint8_t> read_buf_[kReadsInFlight];  // one per read in flight
  std::condition_variable cv_, idle_cv_;
  std::map<uint64_t, FileEntry> files_;  // by write sequence, oldest first
  std::unordered_map<uint64_t, Loc> index_;
  std::deque<Pending> queue_;
  std::unordered_set<uint64_t> queued_;
  int64_t queued_bytes_ = 0;
  int64_t queued_ref_bytes_ = 0;
  int64_t total_bytes_ = 0;
  uint64_t next_seq_ = 1;
  uint64_t use_tick_ = 0;
  std::unordered_map<uint64_t, double> pins_;  // hash -> expiry (tier_clock_s())
  bool pins_dirty_ = false;                     // pins_ changed since session_pins.bin was written
  size_t pins_pruned_at_ = 0;
  bool writing_ = false;
  bool stop_ = false;
  DiskTierStats counters_;
  std::thread writer_;
};

}  // namespace strata
