#include "kv/redis/redis_tier.h"

#include <xxhash.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/log.h"

namespace strata {

namespace {

constexpr char kMagic[8] = {'S', 'T', 'R', 'K', 'V', 'R', 'D', '1'};
constexpr size_t kHeaderBytes = 8 + 8 + 8 + 8;  // magic, identity hash, block hash, data bytes

void put_u64(std::string& s, uint64_t v) {
  char b[8];
  std::memcpy(b, &v, 8);
  s.append(b, 8);
}

uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, 8);
  return v;
}

std::string hex16(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(v));
  return b;
}

}  // namespace

RedisTier::RedisTier(RedisTierOptions options)
    : options_(std::move(options)),
      identity_hash_(XXH3_64bits(options_.identity.data(), options_.identity.size())),
      key_head_(options_.key_prefix + hex16(identity_hash_) + ":"),
      writer_conn_(options_.url, options_.timeout_s),
      lookup_conn_(options_.url, options_.timeout_s),
      read_conn_(options_.url, options_.timeout_s) {
  counters_.enabled = true;
}

Result<std::unique_ptr<RedisTier>> RedisTier::open(RedisTierOptions options) {
  if (options.block_bytes <= 0) return make_error(ErrorCode::kInvalidArgument, "Redis KV tier: block bytes must be > 0");
  if (options.queue_bytes < options.block_bytes) {
    return make_error(ErrorCode::kInvalidArgument, "Redis KV tier: the queue of " + std::to_string(options.queue_bytes) +
                                                       " bytes holds no block of " + std::to_string(options.block_bytes));
  }
  std::unique_ptr<RedisTier> t(new RedisTier(std::move(options)));
  for (RedisClient* c : {&t->writer_conn_, &t->lookup_conn_, &t->read_conn_}) {
    if (auto st = c->connect(); !st.ok()) return st.error();
  }
  t->counters_.connected = true;
  t->writer_ = std::thread([p = t.get()] { p->writer_loop(); });
  return t;
}

RedisTier::~RedisTier() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
}

std::string RedisTier::key(uint64_t hash) const { return key_head_ + hex16(hash); }

std::string RedisTier::encode(uint64_t hash, const uint8_t* data) const {
  std::string v;
  const size_t n = size_t(options_.block_bytes);
  v.reserve(kHeaderBytes + n + 8);
  v.append(kMagic, 8);
  put_u64(v, identity_hash_);
  put_u64(v, hash);
  put_u64(v, uint64_t(n));
  v.append(reinterpret_cast<const char*>(data), n);
  put_u64(v, XXH3_64bits(v.data(), v.size()));
  return v;
}

std::string RedisTier::decode(std::string_view v, uint64_t hash, uint8_t* out) const {
  const size_t n = size_t(options_.block_bytes);
  if (v.size() != kHeaderBytes + n + 8) {
    return "size " + std::to_string(v.size()) + ", expected " + std::to_string(kHeaderBytes + n + 8);
  }
  if (std::memcmp(v.data(), kMagic, 8) != 0) return "bad magic";
  if (get_u64(v.data() + 8) != identity_hash_) return "another state identity";
  if (get_u64(v.data() + 16) != hash) return "another block hash";
  if (get_u64(v.data() + 24) != uint64_t(n)) return "another block size";
  if (get_u64(v.data() + v.size() - 8) != XXH3_64bits(v.data(), v.size() - 8)) return "checksum mismatch";
  std::memcpy(out, v.data() + kHeaderBytes, n);
  return {};
}

void RedisTier::remember_locked(uint64_t hash) {
  if (known_.size() >= kMaxKnown) known_.clear();  // a re-write costs bandwidth, not correctness
  known_.insert(hash);
}

bool RedisTier::known(uint64_t hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  return known_.count(hash) != 0;
}

bool RedisTier::enqueue(uint64_t hash, const uint8_t* data) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (known_.count(hash) != 0) return true;
    const int64_t bytes = options_.block_bytes + int64_t(kHeaderBytes) + 8;
    if (queued_bytes_ + bytes > options_.queue_bytes) {
      ++counters_.dropped_blocks;
      return false;
    }
    queued_bytes_ += bytes;
    remember_locked(hash);  // queued: a second demotion of it is not queued again
  }
  std::string v = encode(hash, data);  // outside the lock: the copy is the cost
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(Pending{hash, std::move(v)});
  }
  cv_.notify_one();
  return true;
}

void RedisTier::writer_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (stop_) break;
    std::vector<Pending> batch;
    while (!queue_.empty() && batch.size() < size_t(options_.max_batch_blocks)) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    writing_ = true;
    lock.unlock();
    std::vector<std::string> keys;
    keys.reserve(batch.size());
    std::vector<std::vector<std::string_view>> cmds;
    for (const Pending& p : batch) keys.push_back(key(p.hash));
    for (size_t i = 0; i < batch.size(); ++i) cmds.push_back({"SET", keys[i], batch[i].value});
    auto r = writer_conn_.pipeline(cmds);
    if (!r.ok()) {
      // Redis unreachable: the batch goes back to the front of the queue and waits for the
      // connection (new blocks are dropped while the queue is full).
      lock.lock();
      if (counters_.connected) log::warn("Redis KV tier: writes fail ({}); blocks wait in the queue", r.error().message);
      counters_.write_errors += int64_t(batch.size());
      counters_.connected = false;
      for (auto it = batch.rbegin(); it != batch.rend(); ++it) queue_.push_front(std::move(*it));
      writing_ = false;
      idle_cv_.notify_all();
      cv_.wait_for(lock, std::chrono::milliseconds(100), [&] { return stop_; });
      continue;
    }
    int64_t written = 0;
    std::vector<uint64_t> failed;
    std::string why;
    for (size_t i = 0; i < batch.size(); ++i) {
      if ((*r)[i].kind == RedisReply::kError) {
        failed.push_back(batch[i].hash);
        why = (*r)[i].str;  // e.g. OOM under maxmemory with a noeviction policy: dropped
      } else {
        ++written;
      }
    }
    lock.lock();
    for (const Pending& p : batch) queued_bytes_ -= options_.block_bytes + int64_t(kHeaderBytes) + 8;
    for (uint64_t h : failed) known_.erase(h);
    counters_.written_blocks += written;
    if (!failed.empty() && counters_.write_errors == 0) log::warn("Redis KV tier: Redis refused writes ({}); those blocks are dropped", why);
    counters_.write_errors += int64_t(failed.size());
    if (!counters_.connected) log::info("Redis KV tier: writes go through again");
    counters_.connected = true;
    counters_.reconnects = writer_conn_.reconnects();
    writing_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
  writing_ = false;
  idle_cv_.notify_all();
}

int32_t RedisTier::count_prefix(std::span<const uint64_t> hashes) {
  if (hashes.empty()) return 0;
  std::vector<std::string> keys;
  keys.reserve(hashes.size());
  for (uint64_t h : hashes) keys.push_back(key(h));
  std::vector<std::vector<std::string_view>> cmds;
  for (const std::string& k : keys) cmds.push_back({"EXISTS", k});
  Result<std::vector<RedisReply>> r = make_error(ErrorCode::kIo, "");
  {
    std::lock_guard<std::mutex> lock(lookup_mu_);
    r = lookup_conn_.pipeline(cmds);
  }
  int32_t n = 0;
  if (r.ok()) {
    while (size_t(n) < hashes.size() && (*r)[size_t(n)].kind == RedisReply::kInteger && (*r)[size_t(n)].integer == 1) ++n;
  }
  std::lock_guard<std::mutex> lock(mu_);
  ++counters_.lookups;
  if (!r.ok()) {
    ++counters_.lookup_errors;
    return 0;
  }
  counters_.lookup_blocks += n;
  return n;
}

void RedisTier::read_many(std::span<const uint64_t> hashes, std::span<uint8_t* const> outs, std::vector<uint8_t>& ok) {
  ok.assign(hashes.size(), 0);
  if (hashes.empty()) return;
  std::vector<std::string> keys;
  keys.reserve(hashes.size());
  for (uint64_t h : hashes) keys.push_back(key(h));
  std::vector<std::vector<std::string_view>> cmds;
  for (const std::string& k : keys) cmds.push_back({"GET", k});
  Result<std::vector<RedisReply>> r = make_error(ErrorCode::kIo, "");
  {
    std::lock_guard<std::mutex> lock(read_mu_);
    r = read_conn_.pipeline(cmds);
  }
  int64_t read = 0, missing = 0, corrupt = 0;
  if (r.ok()) {
    for (size_t i = 0; i < hashes.size(); ++i) {
      const RedisReply& rep = (*r)[i];
      if (rep.kind != RedisReply::kString) {
        ++missing;
        continue;
      }
      if (std::string why = decode(rep.str, hashes[i], outs[i]); !why.empty()) {
        ++corrupt;
        log::warn("Redis KV tier: block {} rejected ({}); recomputed", key(hashes[i]), why);
        continue;
      }
      ok[i] = 1;
      ++read;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!r.ok()) {
    ++counters_.read_errors;
    return;
  }
  for (size_t i = 0; i < hashes.size(); ++i) {
    if (ok[i]) remember_locked(hashes[i]);
  }
  counters_.read_blocks += read;
  counters_.missing_blocks += missing;
  counters_.corrupt_blocks += corrupt;
}

bool RedisTier::flush(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  // Redis down: nothing drains the queue until it is back, so there is nothing to wait for.
  return idle_cv_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                           [&] { return (queue_.empty() && !writing_) || (!counters_.connected && !writing_); }) &&
         queue_.empty();
}

RedisTierStats RedisTier::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  RedisTierStats s = counters_;
  s.queued_bytes = queued_bytes_;
  return s;
}

}  // namespace strata
