// RedisTier: the shared KV tier, full blocks in one Redis node that every replica of a model
// reads and writes, below the host and disk tiers (kv/host/kv_tiers.h).
//
// Key: "<prefix><identity hash>:<block hash>" (hex), the block hash being the prefix cache's
// chain hash. Value (little-endian): "STRKVRD1", u64 identity hash (xxh3 of the identity string:
// model weights, backend, codecs, block layout), u64 block hash, u64 data bytes, the block's
// data, u64 xxh3 of everything before. A value is used only when all of that checks out; a
// corrupt, truncated or foreign one is a miss (counted). Redis's own maxmemory and
// maxmemory-policy (allkeys-lru) bound and evict the store; this tier never deletes.
//
// Writes go through enqueue(): a queue capped in bytes feeds a writer thread that sends its
// blocks in pipelined SETs; what does not fit is dropped and counted. While Redis is
// unreachable the queue waits (and fills: then new blocks are dropped). A block this process
// wrote or read is not sent again (Redis may have evicted it since: it is recomputed elsewhere). Lookups
// (count_prefix: pipelined EXISTS) and reads (read_many: pipelined GET) run on the caller's
// thread over connections of their own. Redis down: every call fails fast (counted), the
// caller serves from its own tiers, and each connection retries after a short interval.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "kv/redis/redis_client.h"

namespace strata {

struct RedisTierOptions {
  RedisUrl url;
  int64_t queue_bytes = int64_t(256) << 20;  // writer queue cap; past it blocks are dropped
  std::string identity;                      // the identity string; blocks of another never load
  int64_t block_bytes = 0;
  std::string key_prefix = "strata:kv:";
  double timeout_s = 0.5;                    // connect and command timeout
  int32_t max_batch_blocks = 64;             // blocks per pipelined write
};

struct RedisTierStats {
  bool enabled = false;
  bool connected = false;      // the writer's connection, at the last write or check
  int64_t written_blocks = 0;
  int64_t dropped_blocks = 0;  // queue full
  int64_t queued_bytes = 0;
  int64_t write_errors = 0;    // blocks of failed write attempts (Redis down: retried; refused: dropped)
  int64_t lookups = 0;         // count_prefix calls
  int64_t lookup_blocks = 0;   // blocks found by them
  int64_t lookup_errors = 0;   // lookups that failed (Redis down): misses
  int64_t read_blocks = 0;     // blocks read and verified
  int64_t read_errors = 0;     // reads that failed (Redis down)
  int64_t missing_blocks = 0;  // blocks gone between lookup and read (evicted)
  int64_t corrupt_blocks = 0;  // values that failed verification (checksum, size, identity)
  int64_t reconnects = 0;
};

class RedisTier {
 public:
  // Connects (the error names the URL and the reason: refused, AUTH, SELECT) and starts the writer.
  static Result<std::unique_ptr<RedisTier>> open(RedisTierOptions options);
  ~RedisTier();  // stops the writer; what is queued is dropped (flush() first to keep it)
  RedisTier(const RedisTier&) = delete;
  RedisTier& operator=(const RedisTier&) = delete;

  int64_t block_bytes() const { return options_.block_bytes; }
  // Whether this process wrote or read `hash` already (so Redis has it, barring eviction).
  bool known(uint64_t hash) const;
  // Queues a copy of the block for writing; false when dropped (queue full). Known blocks are skipped.
  bool enqueue(uint64_t hash, const uint8_t* data);
  // How many leading blocks of `hashes` Redis holds (one round trip); 0 when Redis is down.
  int32_t count_prefix(std::span<const uint64_t> hashes);
  // Reads block i into outs[i] (one round trip); ok[i]: read and verified.
  void read_many(std::span<const uint64_t> hashes, std::span<uint8_t* const> outs, std::vector<uint8_t>& ok);
  // Waits until the queue is written, at most timeout_s. False on timeout, and at once while
  // Redis is unreachable.
  bool flush(double timeout_s);
  RedisTierStats stats() const;

  // The stored value for a block (exposed for tests).
  std::string encode(uint64_t hash, const uint8_t* data) const;
  // Checks a stored value and copies its data to out; the reason it is rejected, else empty.
  std::string decode(std::string_view value, uint64_t hash, uint8_t* out) const;
  std::string key(uint64_t hash) const;

 private:
  explicit RedisTier(RedisTierOptions options);
  void writer_loop();
  void remember_locked(uint64_t hash);

  RedisTierOptions options_;
  uint64_t identity_hash_ = 0;
  std::string key_head_;  // key_prefix + identity hash + ':'
  RedisClient writer_conn_, lookup_conn_, read_conn_;
  std::mutex lookup_mu_, read_mu_;  // each connection serves one thread at a time
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  struct Pending {
    uint64_t hash = 0;
    std::string value;  // encoded
  };
  std::deque<Pending> queue_;
  int64_t queued_bytes_ = 0;
  bool writing_ = false;
  bool stop_ = false;
  std::unordered_set<uint64_t> known_;  // written or read; cleared past kMaxKnown
  static constexpr size_t kMaxKnown = size_t(1) << 22;
  RedisTierStats counters_;
  std::thread writer_;
};

}  // namespace strata
