#include "backend/cuda/device_peaks.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
#include "backend/cuda/kernels.h"

namespace strata::cuda {

namespace {

// Device buffers freed on every path out.
struct Scratch {
  std::vector<void*> ptrs;
  ~Scratch() {
    for (void* p : ptrs) cudaFree(p);
  }
  Result<void*> take(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) {
      cudaGetLastError();
      return make_error(ErrorCode::kResourceExhausted, "device peaks: cudaMalloc of " + std::to_string(bytes) + " bytes failed");
    }
    ptrs.push_back(p);
    return p;
  }
};

// Median milliseconds of `body` over 10 runs after 3 warm-ups.
template <class F>
Result<double> time_ms(cudaStream_t st, F body) {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e0));
  STRATA_CUDA_RETURN_IF_ERROR(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int i = 0; i < 13; ++i) {
    cudaEventRecord(e0, st);
    body();
    cudaEventRecord(e1, st);
    STRATA_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(e1));
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, e0, e1);
    if (i >= 3) t.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

Result<DevicePeaks> measure_device_peaks() {
  int n_dev = 0;
  if (cudaGetDeviceCount(&n_dev) != cudaSuccess || n_dev == 0) {
    return make_error(ErrorCode::kUnsupported, "device peaks: no CUDA device");
  }
  cudaStream_t st = nullptr;
  STRATA_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  DevicePeaks out;
  {
    Scratch s;
    const size_t bytes = size_t(4) << 30;
    auto a = s.take(bytes);
    if (!a.ok()) return a.error();
    auto b = s.take(bytes);
    if (!b.ok()) return b.error();
    launch_fill_random_bf16(static_cast<uint16_t*>(*a), int64_t(bytes / 2), 7, 1.0f, st);
    auto ms = time_ms(st, [&] { cudaMemcpyAsync(*b, *a, bytes, cudaMemcpyDeviceToDevice, st); });
    if (!ms.ok()) return ms.error();
    out.bandwidth_bytes_s = 2.0 * double(bytes) / (*ms * 1e-3);
  }
  {
    Scratch s;
    const int64_t n = 8192;
    const size_t mat = size_t(n * n) * 2, ws_bytes = size_t(32) << 20;
    auto a = s.take(mat);
    if (!a.ok()) return a.error();
    auto b = s.take(mat);
    if (!b.ok()) return b.error();
    auto c = s.take(mat);
    if (!c.ok()) return c.error();
    auto ws = s.take(ws_bytes);
    if (!ws.ok()) return ws.error();
    launch_fill_random_bf16(static_cast<uint16_t*>(*a), n * n, 11, 1.0f, st);
    launch_fill_random_bf16(static_cast<uint16_t*>(*b), n * n, 12, 1.0f, st);
    auto g = Gemm::create(*ws, ws_bytes);
    if (!g.ok()) return g.error();
    auto ms = time_ms(st, [&] {
      (*g)->run(st, static_cast<uint16_t*>(*a), static_cast<uint16_t*>(*b), *c, GemmOut::kBF16, n, n, n);
    });
    if (!ms.ok()) return ms.error();
    out.gemm_flops = 2.0 * double(n) * double(n) * double(n) / (*ms * 1e-3);
    g->reset();
  }
  cudaStreamDestroy(st);
  return out;
}

}  // namespace strata::cuda
