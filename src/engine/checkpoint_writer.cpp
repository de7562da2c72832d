#include "engine/checkpoint_writer.h"

#include <algorithm>
#include <chrono>

#include "core/log.h"

namespace strata {

CheckpointWriter::CheckpointWriter(CheckpointStore& store, size_t max_bytes, bool start_now)
    : store_(store), max_bytes_(max_bytes) {
  if (start_now) start();
}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (!thread_.joinable()) start();  // a writer never started still writes what it holds
  thread_.join();
}

void CheckpointWriter::start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
}

size_t CheckpointWriter::queued_size(const Checkpoint& c) {
  return 64 + c.key.size() + c.generated.size() * sizeof(int32_t) + c.sampler.size();
}

bool CheckpointWriter::write(Checkpoint c) {
  const size_t bytes = queued_size(c);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Op& op : queue_) {
      if (op.remove || op.c.key != c.key || op.c.run != c.run) continue;
      if (queued_bytes_ - op.bytes + bytes > max_bytes_) break;  // the newer one does not fit: drop it
      queued_bytes_ = queued_bytes_ - op.bytes + bytes;
      op.c = std::move(c);
      op.bytes = bytes;
      ++stats_.coalesced;
      return true;
    }
    if (queued_bytes_ + bytes > max_bytes_) {
      ++stats_.dropped;
      return false;
    }
    queue_.push_back(Op{false, std::move(c), bytes});
    queued_bytes_ += bytes;
  }
  wake_.notify_one();
  return true;
}

void CheckpointWriter::remove(const std::string& key, uint64_t run, int64_t generation) {
  store_.retire(run);  // at once: the same request admitted next must not resume a finished run
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (!it->remove && it->c.key == key && it->c.run == run) {
        queued_bytes_ -= it->bytes;
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    Op op;
    op.remove = true;
    op.c.key = key;
    op.c.run = run;
    op.c.generation = generation;
    queue_.push_back(std::move(op));  // removals are not counted against the cap: they free space
  }
  wake_.notify_one();
}

bool CheckpointWriter::flush(double timeout_s) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_.wait_for(lock, std::chrono::duration<double>(timeout_s), [this] { return queue_.empty() && !busy_; });
}

CheckpointWriterStats CheckpointWriter::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CheckpointWriterStats s = stats_;
  s.queued = 0;
  for (const Op& op : queue_) s.queued += op.remove ? 0 : 1;
  s.queued_bytes = int64_t(queued_bytes_);
  return s;
}

void CheckpointWriter::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) {
      if (stop_) return;
      continue;
    }
    Op op = std::move(queue_.front());
    queue_.pop_front();
    if (!op.remove) queued_bytes_ -= op.bytes;
    busy_ = true;
    lock.unlock();
    // last_written_ is the writer thread's own; stats_ is read under mu_.
    if (op.remove) {
      store_.remove(op.c.key, op.c.run, op.c.generation);
      last_written_.erase(op.c.run);
      lock.lock();
    } else {
      const uint64_t run = op.c.run;
      const int64_t generation = op.c.generation;
      auto r = store_.write(std::move(op.c));
      int64_t held = 0;
      if (!r.ok() && failure_log_.take(&held)) {
        log::warn("checkpoint not written: {}{}", r.error().to_string(), log::Throttle::held_note(held));
      }
      int64_t gap = -1;
      if (r.ok() && *r) {
        int64_t& last = last_written_[run];
        gap = generation - last;
        last = generation;
      }
      lock.lock();
      if (!r.ok()) {
        ++stats_.failed;
      } else if (*r) {
        ++stats_.written;
        stats_.max_gap_tokens = std::max(stats_.max_gap_tokens, gap);
      }
    }
    busy_ = false;
    if (queue_.empty()) idle_.notify_all();
  }
}

}  // namespace strata
