// Generation checkpoints: what an in-flight request needs to resume after a restart with the
// exact output of an uninterrupted run. The KV itself goes through the disk KV tier (blocks
// keyed by the prefix-cache chain hash); a checkpoint file holds the rest: the generated ids
// (the last one is the pending token, sampled but without KV yet) and the sampler state.
//
// A checkpoint is keyed by the request (checkpoint_key): prompt ids, sampling params, the seed
// (or the fact that the engine drew one), max_tokens, stop ids, EOS handling and vocab limit;
// the file name is a hash of that key. The file also carries the state identity it was written
// under (the prefix namespace: weights, backend, shape, KV codecs) and the store only resumes one
// of its own identity: another's is skipped with a log line and counted (foreign_skipped()), and
// the request runs cold. The file stores the whole key, so a hash collision is a miss too.
//
// File (little-endian): "STRCKPT1", u32 version, u64 run, i64 generation, u32 identity bytes +
// identity, u32 key bytes + key, u32 n + n i32 generated ids, u32 bytes + Sampler::save() bytes,
// u64 XXH3 of all before.
// Written as <hash>.ckpt.tmp, fsynced, renamed, directory fsynced. A file that fails to parse
// or whose checksum does not match is moved to <dir>/quarantine with a log line and ignored.
//
// Ordering: each request gets a run id. remove() retires its run, and a later write of a
// retired run is refused, so a late write cannot resurrect a finished request. remove() deletes
// the file only when it holds that run's write or an older generation, so it never deletes a
// newer write (of another run of the same request). All methods are thread-safe.
//
// open_redis(): the same checkpoints as values in Redis (key "strata:ckpt:<hash>"), shared by
// replicas of one state identity, so a request whose replica died resumes on another. A value
// that fails to decode is deleted with a log line; Redis down: load() misses (the request runs
// cold) and write() fails (counted by the writer).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/status.h"
#include "engine/request.h"
#include "kv/redis/redis_client.h"

namespace strata {

struct Checkpoint {
  std::string key;                 // checkpoint_key() of the request
  std::string identity;            // the state identity it was written under (the store's)
  uint64_t run = 0;                // the writer's run id (CheckpointStore::new_run)
  int64_t generation = 0;          // generated tokens when written; grows with each write
  std::vector<int32_t> generated;  // generated ids, the pending token last
  std::string sampler;             // Sampler::save() after the pending token was accepted
};

// What a request's output depends on besides the state identity. seed_drawn: the request came
// without a seed (the engine draws one, recorded in the sampler state), so the seed value is
// not part of the key.
std::string checkpoint_key(const GenerationRequest& r, const std::vector<int32_t>& eos_ids, bool seed_drawn);

// The file format (see above); decode errors name what is wrong.
std::string encode_checkpoint(const Checkpoint& c);
Result<Checkpoint> decode_checkpoint(std::string_view bytes);

class CheckpointStore {
 public:
  // Creates the directory and removes stale temporary files. Checkpoints are written under
  // `identity` and only those of `identity` load. Errors name the directory.
  static Result<std::unique_ptr<CheckpointStore>> open(const std::string& dir, const std::string& identity);
  // Checkpoints in Redis at url (connects now; the error names the URL and the reason).
  static Result<std::unique_ptr<CheckpointStore>> open_redis(const RedisUrl& url, const std::string& identity);

  // A fresh run id, unique across restarts (random base, counter).
  uint64_t new_run();
  // The checkpoint stored for key; nullopt when there is none, when its run was retired, when the file is bad
  // (quarantined, logged), when it holds another key (a hash collision) or when it was written
  // under another state identity (logged, counted; the file stays until this identity's write
  // or remove() replaces it).
  std::optional<Checkpoint> load(const std::string& key);
  // Writes atomically under the store's identity (c.identity is ignored). False (nothing
  // written) when c.run was retired; kIo errors name the file.
  Result<bool> write(Checkpoint c);
  // Retires run: its later writes are refused and load() no longer returns its checkpoint
  // (the removal that deletes the file may come later, on a writer thread).
  void retire(uint64_t run);
  // Retires run and deletes key's file if it holds run's write or a generation <= generation,
  // or a checkpoint of another identity (never resumable here).
  void remove(const std::string& key, uint64_t run, int64_t generation);
  // Checkpoints load() skipped because another state identity wrote them.
  int64_t foreign_skipped() const;
  const std::string& identity() const { return identity_; }

  std::filesystem::path path_of(const std::string& key) const;
  const std::filesystem::path& dir() const { return dir_; }

 private:
  CheckpointStore(std::filesystem::path dir, std::string identity);
  bool retired(uint64_t run) const;
  // Reads and decodes path; a bad file is read again under io_mu_ (a write may have replaced
  // it meanwhile) and quarantined if still bad. nullopt: no file or bad file.
  std::optional<Checkpoint> read_file(const std::filesystem::path& path);
  // The same with io_mu_ held.
  std::optional<Checkpoint> read_file_io_locked(const std::filesystem::path& path);
  void quarantine_io_locked(const std::filesystem::path& path, const std::string& why);
  // Redis: the key of a checkpoint key, and the decoded value stored there (nullopt: none, bad
  // (deleted, logged) or Redis unreachable (logged)); io_mu_ held.
  std::string redis_key(const std::string& key) const;
  std::optional<Checkpoint> redis_read_io_locked(const std::string& key);

  std::filesystem::path dir_;
  std::string identity_;
  // mu_ guards the run ids and retired_ and is never held across I/O: the engine's thread takes
  // it (new_run, retire) while the writer thread writes and fsyncs, which on a busy disk takes
  // tens of milliseconds. io_mu_ orders the writes, removals and quarantines of files, and
  // guards the Redis connection.
  mutable std::mutex mu_;
  std::mutex io_mu_;
  std::atomic<int64_t> foreign_skipped_{0};
  std::unordered_set<uint64_t> retired_;
  uint64_t run_base_ = 0;
  uint64_t next_run_ = 0;
  std::unique_ptr<RedisClient> redis_;  // null: files in dir_
};

}  // namespace strata
