// The grouped expert GEMMs of one MoE layer on the GPU (moe.h): gate|up (rows gathered from the
// tokens, bf16 out) then down (f32 out), for each grouped-GEMM path, at several prefill sizes.
// The tensor-core path in its four block tiles (MmaTile).
// Routing: every token takes top_k distinct experts uniformly at random, grouped on the device
// by launch_moe_group. Prints per size and path the two launches' median time, the FLOP rate
// (2 * rows * (2 I H + H I)) and its ratio to the cuBLASLt bf16 8192^3 rate measured in the same
// run, and the layer count times that time (what one prefill spends in expert GEMMs). The GEMV
// path joins at sizes up to 256 tokens (around where the dispatch switches).
// Usage: bench_moe_gemm [experts=128] [top_k=8] [hidden=2048] [inter=768] [layers=48]
//                       [tokens=16,32,64,128,256,1024,4096,16384] [reps=20]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/moe.h"
#include "bench_timing.h"

using namespace strata;
using namespace strata::cuda;
using namespace strata::cuda::bench;

namespace {

std::vector<int32_t> parse_list(const char* s) {
  std::vector<int32_t> v;
  std::string cur;
  for (const char* p = s;; ++p) {
    if (*p == ',' || *p == '\0') {
      if (!cur.empty()) v.push_back(std::atoi(cur.c_str()));
      cur.clear();
      if (*p == '\0') break;
    } else {
      cur += *p;
    }
  }
  return v;
}

template <class T>
T* device_alloc(size_t n) {
  T* p = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&p), std::max<size_t>(1, n) * sizeof(T)));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  const int32_t E = argc > 1 ? std::atoi(argv[1]) : 128;
  const int32_t top_k = argc > 2 ? std::atoi(argv[2]) : 8;
  const int64_t H = argc > 3 ? std::atoll(argv[3]) : 2048;
  const int64_t I = argc > 4 ? std::atoll(argv[4]) : 768;
  const int32_t layers = argc > 5 ? std::atoi(argv[5]) : 48;
  const std::vector<int32_t> sizes = parse_list(argc > 6 ? argv[6] : "16,32,64,128,256,1024,4096,16384");
  const int reps = argc > 7 ? std::atoi(argv[7]) : 20;
  cudaStream_t st = nullptr;
  STRATA_CUDA_CHECK(cudaStreamCreate(&st));
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("shape: %d experts, top %d, hidden %lld, expert intermediate %lld, %d layers\n", E, top_k, (long long)H,
              (long long)I, layers);
  const double peak = gemm_rate(st);

  uint16_t* w_gu = device_alloc<uint16_t>(size_t(E) * 2 * I * H);
  uint16_t* w_dn = device_alloc<uint16_t>(size_t(E) * H * I);
  launch_fill_random_bf16(w_gu, int64_t(E) * 2 * I * H, 21, 0.05f, st);
  launch_fill_random_bf16(w_dn, int64_t(E) * H * I, 22, 0.05f, st);
  std::mt19937 rng(1234);
  for (const int32_t n : sizes) {
    const int64_t rows = int64_t(n) * top_k;
    std::vector<int32_t> ids(static_cast<size_t>(rows)), perm(static_cast<size_t>(E));
    std::iota(perm.begin(), perm.end(), 0);
    for (int32_t t = 0; t < n; ++t) {
      for (int32_t j = 0; j < top_k; ++j) {  // a partial Fisher-Yates draw: top_k distinct experts
        std::uniform_int_distribution<int32_t> u(j, E - 1);
        std::swap(perm[size_t(j)], perm[size_t(u(rng))]);
        ids[size_t(t) * top_k + j] = perm[size_t(j)];
      }
    }
    uint16_t* x = device_alloc<uint16_t>(size_t(n) * H);
    uint16_t* gate_up = device_alloc<uint16_t>(size_t(rows) * 2 * I);
    uint16_t* act = device_alloc<uint16_t>(size_t(rows) * I);
    float* y = device_alloc<float>(size_t(rows) * H);
    int32_t* d_ids = device_alloc<int32_t>(size_t(rows));
    int32_t* offsets = device_alloc<int32_t>(size_t(E) + 1);
    int32_t* sorted = device_alloc<int32_t>(size_t(rows));
    int32_t* slot_row = device_alloc<int32_t>(size_t(rows));
    launch_fill_random_bf16(x, int64_t(n) * H, 23, 1.0f, st);
    launch_fill_random_bf16(act, rows * I, 24, 1.0f, st);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(d_ids, ids.data(), ids.size() * sizeof(int32_t), cudaMemcpyHostToDevice, st));
    launch_moe_group({d_ids, int32_t(rows), E, offsets, sorted, slot_row}, st);
    const double flops = 2.0 * double(rows) * double(3 * I * H);
    double tiled_ms = 0.0;
    struct Variant {
      GroupedGemmPath path;
      MmaTile tile;  // of the tensor-core kernel
    };
    std::vector<Variant> paths = {{GroupedGemmPath::kTiled, MmaTile::k128x128},
                                    {GroupedGemmPath::kMma, MmaTile::k128x128},
                                    {GroupedGemmPath::kMma, MmaTile::k128x256},
                                    {GroupedGemmPath::kMma, MmaTile::k128x128w4},
                                    {GroupedGemmPath::kMma, MmaTile::k128x128w8}};
    if (n <= 256) paths.push_back({GroupedGemmPath::kGemv, MmaTile::k128x128});
    for (const auto& [path, tile] : paths) {
      GroupedGemmArgs gu{x, sorted, top_k, w_gu, offsets, gate_up, 0, E, n, 2 * I, H};
      GroupedGemmArgs dn{act, nullptr, 1, w_dn, offsets, y, 1, E, n, H, I};
      gu.path = dn.path = path;
      const auto one = [&](const GroupedGemmArgs& a) {
        return median(time_runs(st, 2, reps, [&] {
          if (path == GroupedGemmPath::kMma) {
            launch_grouped_gemm_mma(a, st, tile);
          } else {
            launch_grouped_gemm(a, st);
          }
        }));
      };
      const double gu_ms = one(gu), dn_ms = one(dn), ms = gu_ms + dn_ms;
      if (path == GroupedGemmPath::kTiled) tiled_ms = ms;
      const std::string name = path == GroupedGemmPath::kTiled ? "tiled"
                               : path == GroupedGemmPath::kGemv ? "gemv"
                                                                : tile == MmaTile::k128x128  ? "mma/128"
                               : tile == MmaTile::k128x256  ? "mma/256"
                               : tile == MmaTile::k128x128w4 ? "mma/128w4"
                                                             : "mma/128w8";
      std::printf("tokens %6d %-8s gate_up %8.3f ms  down %8.3f ms  layer %8.3f ms  %6.1f TFLOP/s  %.3f of cuBLASLt  x%d layers %8.2f ms",
                  n, name.c_str(), gu_ms, dn_ms, ms, flops / ms * 1e-9, flops / (ms * 1e-3) / peak, layers, ms * layers);
      if (path != GroupedGemmPath::kTiled) std::printf("  speedup %.1fx", tiled_ms / ms);
      std::printf("\n");
    }
    for (void* p : {static_cast<void*>(x), static_cast<void*>(gate_up), static_cast<void*>(act), static_cast<void*>(y),
                    static_cast<void*>(d_ids), static_cast<void*>(offsets), static_cast<void*>(sorted), static_cast<void*>(slot_row)}) {
      cudaFree(p);
    }
  }
  cudaFree(w_gu);
  cudaFree(w_dn);
  return 0;
}
