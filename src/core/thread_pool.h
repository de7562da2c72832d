// ThreadPool: a fixed set of workers for data-parallel kernels.
//
// parallel_for splits [0, n) into one contiguous static range per thread, so which thread
// computes an index never depends on timing; kernels keep their reduction order inside an
// index, which makes results independent of thread count and batch composition.
// One caller at a time (the engine thread owns the pool).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
 public:
  // n_threads <= 0: one per hardware thread.
  explicit ThreadPool(int n_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // fn(begin, end, thread_index) over a static partition of [0, n); blocks until all done.
  // Ranges are aligned to `grain` items (except the last).
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn, int64_t grain = 1);

 private:
  void worker_loop(int index);

  int n_threads_ = 1;
  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable cv_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int64_t job_grain_ = 1;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  bool stop_ = false;
};

}  // namespace strata
