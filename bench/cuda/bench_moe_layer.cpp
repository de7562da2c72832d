// One MoE layer's kernels on the GPU as a prefill step runs them (moe.h): the router GEMM
// (cuBLASLt), routing, grouping by expert, the gate|up grouped GEMM, the gated activation, the
// down grouped GEMM and the weighted combine, each timed alone (median of reps) at several token
// counts. Routing comes from the router GEMM over random activations, as with dummy weights, so
// groups are ragged. Per kernel: its time, its limit max(bytes / copy bandwidth, FLOPs / cuBLASLt
// bf16 rate) with both ceilings measured in the same run, and the ratio; then the layer's sum,
// and that times the layer count.
// Usage: bench_moe_layer [experts=128] [top_k=8] [hidden=2048] [inter=768] [layers=48]
//                        [tokens=512,4096,16384] [reps=20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/gemm.h"
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

struct Stage {
  std::string name;
  double bytes, flops;
  std::function<void()> run;
};

}  // namespace

int main(int argc, char** argv) {
  const int32_t E = argc > 1 ? std::atoi(argv[1]) : 128;
  const int32_t top_k = argc > 2 ? std::atoi(argv[2]) : 8;
  const int64_t H = argc > 3 ? std::atoll(argv[3]) : 2048;
  const int64_t I = argc > 4 ? std::atoll(argv[4]) : 768;
  const int32_t layers = argc > 5 ? std::atoi(argv[5]) : 48;
  const std::vector<int32_t> sizes = parse_list(argc > 6 ? argv[6] : "512,4096,16384");
  const int reps = argc > 7 ? std::atoi(argv[7]) : 20;
  cudaStream_t st = nullptr;
  STRATA_CUDA_CHECK(cudaStreamCreate(&st));
  cudaDeviceProp prop{};
  STRATA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  std::printf("shape: %d experts, top %d, hidden %lld, expert intermediate %lld, %d layers\n", E, top_k, (long long)H,
              (long long)I, layers);
  const double bw = copy_bandwidth(st), rate = gemm_rate(st);

  void* ws = nullptr;
  STRATA_CUDA_CHECK(cudaMalloc(&ws, size_t(32) << 20));
  auto gemm_or = Gemm::create(ws, size_t(32) << 20);
  if (!gemm_or.ok()) {
    std::fprintf(stderr, "%s\n", gemm_or.error().to_string().c_str());
    return 1;
  }
  Gemm& gemm = **gemm_or;
  uint16_t* router = device_alloc<uint16_t>(size_t(E) * H);
  uint16_t* w_gu = device_alloc<uint16_t>(size_t(E) * 2 * I * H);
  uint16_t* w_dn = device_alloc<uint16_t>(size_t(E) * H * I);
  launch_fill_random_bf16(router, int64_t(E) * H, 20, 0.05f, st);
  launch_fill_random_bf16(w_gu, int64_t(E) * 2 * I * H, 21, 0.05f, st);
  launch_fill_random_bf16(w_dn, int64_t(E) * H * I, 22, 0.05f, st);
  const char* env = std::getenv("STRATA_MOE_GEMM");
  std::printf("grouped GEMM dispatch: %s\n", env != nullptr ? env : "default");
  for (const int32_t n : sizes) {
    const int64_t rows = int64_t(n) * top_k;
    uint16_t* h = device_alloc<uint16_t>(size_t(n) * H);
    float* logits = device_alloc<float>(size_t(n) * E);
    int32_t* ids = device_alloc<int32_t>(size_t(rows));
    float* weights = device_alloc<float>(size_t(rows));
    int32_t* offsets = device_alloc<int32_t>(size_t(E) + 1);
    int32_t* sorted = device_alloc<int32_t>(size_t(rows));
    int32_t* slot_row = device_alloc<int32_t>(size_t(rows));
    uint16_t* gate_up = device_alloc<uint16_t>(size_t(rows) * 2 * I);
    uint16_t* act = device_alloc<uint16_t>(size_t(rows) * I);
    float* y = device_alloc<float>(size_t(rows) * H);
    float* out = device_alloc<float>(size_t(n) * H);
    launch_fill_random_bf16(h, int64_t(n) * H, 23, 1.0f, st);

    const MoeRouteArgs route{logits, ids, weights, n, E, top_k, 1, nullptr};
    const MoeGroupArgs group{ids, int32_t(rows), E, offsets, sorted, slot_row};
    const GroupedGemmArgs gu{h, sorted, top_k, w_gu, offsets, gate_up, 0, E, n, 2 * I, H};
    const GroupedGemmArgs dn{act, nullptr, 1, w_dn, offsets, y, 1, E, n, H, I};
    const GatedActArgs ga{gate_up, act, int32_t(rows), int32_t(I), Act::kSilu};
    const MoeCombineArgs comb{y, ids, weights, slot_row, out, n, top_k, int32_t(H)};
    // Route once so that every stage below sees this routing.
    gemm.run(st, h, router, logits, GemmOut::kF32, n, E, H);
    launch_moe_route(route, st);
    launch_moe_group(group, st);
    std::vector<int32_t> off(size_t(E) + 1);
    STRATA_CUDA_CHECK(cudaMemcpyAsync(off.data(), offsets, off.size() * sizeof(int32_t), cudaMemcpyDeviceToHost, st));
    STRATA_CUDA_CHECK(cudaStreamSynchronize(st));
    int64_t tiles = 0, active = 0;
    int32_t most = 0;
    for (int32_t e = 0; e < E; ++e) {
      const int32_t c = off[size_t(e) + 1] - off[size_t(e)];
      tiles += (c + 127) / 128;
      active += c > 0;
      most = std::max(most, c);
    }
    std::printf("tokens %d: %lld rows, %lld of %d experts active, largest group %d, 128-row tiles %lld (%.3f of their rows used)\n",
                n, (long long)rows, (long long)active, E, most, (long long)tiles, double(rows) / double(tiles * 128));
    const double w_gu_bytes = double(active) * 2 * I * H * 2, w_dn_bytes = double(active) * H * I * 2;
    const std::vector<Stage> stages = {
        {"router GEMM", double(n) * H * 2 + double(E) * H * 2 + double(n) * E * 4, 2.0 * n * E * H,
         [&] { gemm.run(st, h, router, logits, GemmOut::kF32, n, E, H); }},
        {"route (top-k)", double(n) * E * 4 + double(rows) * 8, 0, [&] { launch_moe_route(route, st); }},
        {"group by expert", double(rows) * 12 + double(E + 1) * 4, 0, [&] { launch_moe_group(group, st); }},
        {"gate|up GEMM", w_gu_bytes + double(n) * H * 2 + double(rows) * 2 * I * 2, 2.0 * rows * 2 * I * H,
         [&] { launch_grouped_gemm(gu, st); }},
        {"gated act", double(rows) * 3 * I * 2, 0, [&] { launch_gated_act(ga, st); }},
        {"down GEMM", w_dn_bytes + double(rows) * I * 2 + double(rows) * H * 4, 2.0 * rows * H * I,
         [&] { launch_grouped_gemm(dn, st); }},
        {"combine", double(rows) * H * 4 + double(n) * H * 4 + double(rows) * 12, 0, [&] { launch_moe_combine(comb, st); }},
    };
    double sum_ms = 0.0, sum_limit = 0.0;
    for (const Stage& s : stages) {
      const double ms = median(time_runs(st, 2, reps, s.run));
      const double limit = std::max(s.bytes / bw, s.flops / rate) * 1e3;
      sum_ms += ms;
      sum_limit += limit;
      std::printf("  %-16s %8.3f ms  limit %8.3f ms (%s)  %.3f of it\n", s.name.c_str(), ms, limit,
                  s.flops / rate > s.bytes / bw ? "FLOPs" : "bytes", limit / ms);
    }
    std::printf("  layer            %8.3f ms  limit %8.3f ms  %.3f of it;  x%d layers %8.2f ms (limit %.2f ms)\n", sum_ms, sum_limit,
                sum_limit / sum_ms, layers, sum_ms * layers, sum_limit * layers);
    // The tensor-core kernel's block tiles on this routing (gate|up + down).
    for (const auto& [tile, name] : {std::pair{MmaTile::k128x128, "128x128"}, std::pair{MmaTile::k128x128w4, "128x128 alternating"},
                                     std::pair{MmaTile::k128x256, "128x256"}}) {
      const double g_ms = median(time_runs(st, 2, reps, [&] { launch_grouped_gemm_mma(gu, st, tile); }));
      const double d_ms = median(time_runs(st, 2, reps, [&] { launch_grouped_gemm_mma(dn, st, tile); }));
      std::printf("  tile %-20s gate|up %8.3f ms  down %8.3f ms  %.1f TFLOP/s\n", name, g_ms, d_ms,
                  2.0 * rows * 3 * I * H / (g_ms + d_ms) * 1e-9);
    }
    for (void* p : {static_cast<void*>(h), static_cast<void*>(logits), static_cast<void*>(ids), static_cast<void*>(weights),
                    static_cast<void*>(offsets), static_cast<void*>(sorted), static_cast<void*>(slot_row), static_cast<void*>(gate_up),
                    static_cast<void*>(act), static_cast<void*>(y), static_cast<void*>(out)}) {
      cudaFree(p);
    }
  }
  gemm_or->reset();
  cudaFree(ws);
  cudaFree(router);
  cudaFree(w_gu);
  cudaFree(w_dn);
  return 0;
}
