// Helpers shared by the benchmarks: timing, the machine's memory bandwidth, OpenBLAS controls.
// Every benchmark prints its result as a ratio to a limit measured in the same run.
#pragma once

#include <dlfcn.h>
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "core/thread_pool.h"

namespace strata::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best-of-`reps` wall time of fn, in seconds (the minimum filters noise from other work).
inline double best_seconds(int reps, const std::function<void()>& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// Sum of words [b, e) with wide loads: streaming reads at the memory limit, not the adder's.
__attribute__((target("avx512f"))) inline uint64_t sum_words_avx512(const uint64_t* p, int64_t b, int64_t e) {
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = b;
  for (; i + 32 <= e; i += 32) {
    s0 = _mm512_add_epi64(s0, _mm512_loadu_si512(p + i));
    s1 = _mm512_add_epi64(s1, _mm512_loadu_si512(p + i + 8));
    s2 = _mm512_add_epi64(s2, _mm512_loadu_si512(p + i + 16));
    s3 = _mm512_add_epi64(s3, _mm512_loadu_si512(p + i + 24));
  }
  uint64_t s = uint64_t(_mm512_reduce_add_epi64(_mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3))));
  for (; i < e; ++i) s += p[i];
  return s;
}

__attribute__((target("avx2"))) inline uint64_t sum_words_avx2(const uint64_t* p, int64_t b, int64_t e) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = b;
  for (; i + 16 <= e; i += 16) {
    s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    s2 = _mm256_add_epi64(s2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    s3 = _mm256_add_epi64(s3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes),
                     _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3)));
  uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < e; ++i) s += p[i];
  return s;
}

inline uint64_t sum_words(const uint64_t* p, int64_t b, int64_t e) {
  if (__builtin_cpu_supports("avx512f")) return sum_words_avx512(p, b, e);
  if (__builtin_cpu_supports("avx2")) return sum_words_avx2(p, b, e);
  uint64_t s = 0;
  for (int64_t i = b; i < e; ++i) s += p[i];
  return s;
}

struct Bandwidth {
  double read_gbs;  // bytes read per second / 1e9 (streaming sum, all pool threads)
  double copy_gbs;  // (bytes read + bytes written) per second / 1e9 (memcpy, all pool threads)
};

// Streams `bytes` (>> last-level cache) through all pool threads, best of `reps`.
inline Bandwidth measure_bandwidth(ThreadPool& pool, size_t bytes, int reps) {
  const size_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> src(n), dst(n);
  pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) src[size_t(i)] = uint64_t(i) * 2654435761u;
    std::memset(dst.data() + b, 0, size_t(e - b) * sizeof(uint64_t));
  });
  std::vector<uint64_t> sums(size_t(pool.size()) * 8);
  const double t_read = best_seconds(reps, [&] {
    pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int t) { sums[size_t(t) * 8] = sum_words(src.data(), b, e); },
                      4096);
  });
  const double t_copy = best_seconds(reps, [&] {
    pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int) {
      std::memcpy(dst.data() + b, src.data() + b, size_t(e - b) * sizeof(uint64_t));
    }, 4096);
  });
  uint64_t keep = 0;
  for (auto s : sums) keep += s;
  if (keep == 42) std::printf(" ");
  return {double(n * sizeof(uint64_t)) / t_read / 1e9, 2.0 * double(n * sizeof(uint64_t)) / t_copy / 1e9};
}

}  // namespace strata::bench

// OpenBLAS's own controls: bound directly when OpenBLAS is linked in (weak, so a generic BLAS
// still links), else looked up at run time.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));
extern "C" char* openblas_get_corename() __attribute__((weak));

namespace strata::bench {

inline void blas_set_threads(int n) {
  auto fn = &openblas_set_num_threads != nullptr
                ? &openblas_set_num_threads
                : reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (fn != nullptr)
    fn(n);
  else
    std::printf("warning: openblas_set_num_threads not found; BLAS thread count not set\n");
}

inline const char* blas_core_name() {
  auto fn = &openblas_get_corename != nullptr
                ? &openblas_get_corename
                : reinterpret_cast<char* (*)()>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  return fn != nullptr ? fn() : "(not OpenBLAS)";
}

}  // namespace strata::bench
