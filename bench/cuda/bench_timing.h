// Timing helpers of the CUDA benchmarks: event timing, medians, and the two ceilings a
// benchmark reports its ratios against, measured in the same run (the device copy bandwidth,
// bytes read + written by a device-to-device cudaMemcpy of 4 GiB, and the cuBLASLt bf16
// 8192^3 GEMM rate). Each prints its line and exits the process on a CUDA error.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"
#include "core/status.h"

namespace strata::cuda::bench {

// Prints a failed step's error and ends the benchmark.
inline void check_ok(const Status& s) {
  if (s.ok()) return;
  std::fprintf(stderr, "%s\n", s.error().to_string().c_str());
  std::exit(1);
}

// Milliseconds of each of `reps` runs of body() on stream st (events around each run), after
// `warmup` untimed runs.
template <class F>
std::vector<double> time_runs(cudaStream_t st, int warmup, int reps, F body) {
  cudaEvent_t e0, e1;
  STRATA_CUDA_CHECK(cudaEventCreate(&e0));
  STRATA_CUDA_CHECK(cudaEventCreate(&e1));
  for (int i = 0; i < warmup; ++i) body();
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    STRATA_CUDA_CHECK(cudaEventRecord(e0, st));
    body();
    STRATA_CUDA_CHECK(cudaEventRecord(e1, st));
    STRATA_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return t;
}

inline float elapsed_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.0f;
  STRATA_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
  return ms;
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Device-to-device copy of 4 GiB: bytes read + written per second.
inline double copy_bandwidth(cudaStream_t st) {
  const size_t bytes = size_t(4) << 30;
  void *a = nullptr, *b = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(&a, bytes));
  STRATA_CUDA_CHECK(cudaMalloc(&b, bytes));
  launch_fill_random_bf16(static_cast<uint16_t*>(a), int64_t(bytes / 2), 7, 1.0f, st);
  cudaEvent_t e0, e1;
  STRATA_CUDA_CHECK(cudaEventCreate(&e0));
  STRATA_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    STRATA_CUDA_CHECK(cudaEventRecord(e0, st));
    STRATA_CUDA_CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st));
    STRATA_CUDA_CHECK(cudaEventRecord(e1, st));
    STRATA_CUDA_CHECK(cudaEventSynchronize(e1));
    if (i >= 3) t.push_back(elapsed_ms(e0, e1));
  }
  cudaFree(a);
  cudaFree(b);
  const double ms = median(t);
  std::printf("copy D2D: %zu bytes in %.3f ms (median of %zu) -> %.1f GB/s read+write\n", bytes, ms, t.size(),
              2.0 * double(bytes) / ms * 1e-6);
  return 2.0 * double(bytes) / (ms * 1e-3);
}

// cuBLASLt bf16 8192^3 on random data: FLOP/s.
inline double gemm_rate(cudaStream_t st) {
  const int64_t n = 8192;
  uint16_t *a = nullptr, *b = nullptr, *c = nullptr;
  void* ws = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&a), size_t(n * n) * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&b), size_t(n * n) * 2));
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&c), size_t(n * n) * 2));
  STRATA_CUDA_CHECK(cudaMalloc(&ws, size_t(32) << 20));
  launch_fill_random_bf16(a, n * n, 11, 1.0f, st);
  launch_fill_random_bf16(b, n * n, 12, 1.0f, st);
  auto g = Gemm::create(ws, size_t(32) << 20);
  if (!g.ok()) {
    std::fprintf(stderr, "%s\n", g.error().to_string().c_str());
    std::exit(1);
  }
  cudaEvent_t e0, e1;
  STRATA_CUDA_CHECK(cudaEventCreate(&e0));
  STRATA_CUDA_CHECK(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    STRATA_CUDA_CHECK(cudaEventRecord(e0, st));
    (*g)->run(st, a, b, c, GemmOut::kBF16, n, n, n);
    STRATA_CUDA_CHECK(cudaEventRecord(e1, st));
    STRATA_CUDA_CHECK(cudaEventSynchronize(e1));
    if (i >= 3) t.push_back(elapsed_ms(e0, e1));
  }
  g->reset();
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  cudaFree(ws);
  const double ms = median(t);
  const double flops = 2.0 * double(n) * n * n;
  std::printf("GEMM bf16 8192^3 (cuBLASLt): %.3f ms (median of %zu) -> %.1f TFLOP/s\n", ms, t.size(), flops / ms * 1e-9);
  return flops / (ms * 1e-3);
}

}  // namespace strata::cuda::bench
