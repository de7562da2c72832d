// CheckpointWriter: generation checkpoints written off the engine thread. The engine hands over
// a snapshot (ids, sampler state: bytes, no references into the engine) and goes on; one
// thread encodes, writes and fsyncs them through the CheckpointStore in the order they came.
// The queue holds at most max_bytes of snapshots: a request's queued write is replaced by its
// newer one (coalesced: only the latest state matters), and a write that does not fit is
// dropped and counted, never waited for. remove() drops the key's queued writes and queues the
// removal behind what is already queued, so a finished request's file is never resurrected.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "core/log.h"
#include "engine/checkpoint.h"

namespace strata {

class CheckpointWriter {
 public:
  // start false: the thread starts at start() (tests fill the queue first).
  CheckpointWriter(CheckpointStore& store, size_t max_bytes, bool start = true);
  ~CheckpointWriter();  // writes what is queued, then stops
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void start();
  // Queues c; false: dropped (the queue is full).
  bool write(Checkpoint c);
  // Drops key's queued writes and queues CheckpointStore::remove(key, run, generation).
  void remove(const std::string& key, uint64_t run, int64_t generation);
  // Waits until the queue is empty and no operation runs, at most timeout_s; false on timeout.
  bool flush(double timeout_s);
  CheckpointWriterStats stats() const;

  // The bytes a queued checkpoint is counted as.
  static size_t queued_size(const Checkpoint& c);

 private:
  struct Op {
    bool remove = false;
    Checkpoint c;            // a write; for a removal: key, run and generation
    size_t bytes = 0;
  };
  void run();

  CheckpointStore& store_;
  const size_t max_bytes_;
  mutable std::mutex mu_;
  std::condition_variable wake_, idle_;
  std::deque<Op> queue_;
  size_t queued_bytes_ = 0;
  bool busy_ = false;
  bool stop_ = false;
  CheckpointWriterStats stats_;
  std::unordered_map<uint64_t, int64_t> last_written_;  // by run: the generation last written (writer thread)
  log::Throttle failure_log_;  // failed writes: a line at most every 10 s
  std::thread thread_;
};

}  // namespace strata
