#include "core/thread_pool.h"

#include <algorithm>

namespace strata {

namespace {
// Static range of worker `t` out of `nt` over n items in units of `grain`.
void static_range(int64_t n, int64_t grain, int t, int nt, int64_t* b, int64_t* e) {
  const int64_t units = (n + grain - 1) / grain;
  const int64_t per = units / nt, rem = units % nt;
  const int64_t ub = t * per + std::min<int64_t>(t, rem);
  const int64_t ue = ub + per + (t < rem ? 1 : 0);
  *b = std::min(n, ub * grain);
  *e = std::min(n, ue * grain);
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) {
  n_threads_ = n_threads > 0 ? n_threads : std::max(1u, std::thread::hardware_concurrency());
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_threads_ == 1 || n <= grain) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_n_ = n;
    job_grain_ = grain;
    pending_.store(n_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_all();
  int64_t b, e;
  static_range(n, grain, 0, n_threads_, &b, &e);
  if (b < e) fn(b, e, 0);
  // Workers finish within microseconds for decode-sized jobs: spin before yielding.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins > 2000) std::this_thread::yield();
  }
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    // Spin briefly for the next job (decode issues many small ones), then sleep.
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spins = 0; gen == seen && spins < 20000; ++spins) gen = generation_.load(std::memory_order_acquire);
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    const std::function<void(int64_t, int64_t, int)>* job;
    int64_t n, grain;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) return;
      job = job_;
      n = job_n_;
      grain = job_grain_;
    }
    int64_t b, e;
    static_range(n, grain, index, n_threads_, &b, &e);
    if (b < e) (*job)(b, e, index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace strata
