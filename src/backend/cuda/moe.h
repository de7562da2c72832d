// Mixture-of-experts kernels: routing, grouping of the routed (token, expert) pairs by expert,
// a grouped bf16 GEMM over the groups, and the weighted sum back per token. Everything stays on
// the device (no host read of the per-expert counts), so a step with MoE layers still captures
// into a CUDA graph. Same conventions as kernels.h; each kernel is checked against a plain host
// loop in tests/gpu/gpu_moe_test.cpp.
//
// One sparse layer, n tokens, top-k of E experts, slots s = t * k + j:
//   logits = h . router^T                    [n, E] f32 (Gemm)
//   launch_moe_route:  ids, weights          [n, k]
//   launch_moe_group:  offsets [E + 1], sorted_slot / slot_row [n k]: expert e owns sorted rows
//                      offsets[e] .. offsets[e + 1]
//   launch_grouped_gemm (gather h rows by sorted_slot / k) -> gate_up [n k, 2I] bf16
//   launch_gated_act                                       -> act     [n k, I]  bf16
//   launch_grouped_gemm                                    -> y       [n k, H]  f32
//   launch_moe_combine:  out[t] = sum_j weights[t, j] * y[slot_row[t k + j]] (ascending expert)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

// Per token: p = softmax(logits[t]) in f32; the k experts of largest p (ties: lower id first),
// in that order; weight = p (divided by the k chosen p's sum when renormalize), times
// expert_scale[e] when given.
struct MoeRouteArgs {
  const float* logits;        // [n, n_experts]
  int32_t* ids;               // [n, k]
  float* weights;             // [n, k]
  int32_t n;
  int32_t n_experts;
  int32_t k;                  // <= n_experts
  int32_t renormalize;
  const float* expert_scale;  // [n_experts] or null
  // 0: a warp per token where n_experts <= 256 and k <= 32; 1: the thread-per-token kernel
  // (the reference the tests compare against).
  int32_t reference = 0;
};
void launch_moe_route(const MoeRouteArgs& a, cudaStream_t stream);

// Counting sort of the n_slots slots by expert id (the order inside a group is unspecified:
// rows are computed independently). One block; shared memory holds 2 * n_experts counters.
struct MoeGroupArgs {
  const int32_t* ids;    // [n_slots], each in [0, n_experts)
  int32_t n_slots;
  int32_t n_experts;     // <= 4096
  int32_t* offsets;      // [n_experts + 1]
  int32_t* sorted_slot;  // [n_slots]: the slot of each sorted row
  int32_t* slot_row;     // [n_slots]: the sorted row of each slot
};
void launch_moe_group(const MoeGroupArgs& a, cudaStream_t stream);

// kAuto: the grouped GEMV when rows_per_expert <= kGroupedGemvMaxRows (decode: each active
// expert's weights streamed once), else the tensor-core kernel (moe_mma.cu) where its
// alignment holds, else the tiled kernel, the plain reference; the others force one (tests).
// STRATA_MOE_GEMM=tiled makes kAuto take the tiled kernel for every step, =simt the CUDA-core
// dispatch from before kMma (the GEMV up to 256 rows per expert, else the tiled kernel).
enum class GroupedGemmPath : int32_t { kAuto = 0, kTiled = 1, kGemv = 2, kMma = 3 };
// Past 32 tokens the tensor-core kernel, which also reads each active expert once, is faster
// (bench_moe_gemm, Qwen3-30B-A3B experts, a layer: 0.356 against 0.364 ms at 32 tokens, 0.384
// against 0.544 ms at 64).
inline constexpr int32_t kGroupedGemvMaxRows = 32;

// For every expert e and sorted row r in [offsets[e], offsets[e + 1]):
//   y[r, :] = x[src(r), :] . w[e]^T, src(r) = row_src ? row_src[r] / row_src_div : r,
// bf16 inputs (plus their lo parts when given), f32 sums, y f32 or bf16. rows_per_expert bounds every group's size (grid size).
struct GroupedGemmArgs {
  const uint16_t* x;        // [*, k] bf16
  const int32_t* row_src;   // [rows] or null
  int32_t row_src_div;      // >= 1
  const uint16_t* w;        // [n_experts, n, k] bf16
  const int32_t* offsets;   // [n_experts + 1]
  void* y;                  // [rows, n] f32 or bf16
  int32_t out_f32;
  int32_t n_experts;
  int32_t rows_per_expert;  // >= offsets[e + 1] - offsets[e] for every e
  int64_t n;
  int64_t k;
  // Split checkpoints (weight_split.h): the bf16 parts that x's and w's bf16 rounding lost,
  // same layouts; each operand is read as hi + lo (in f32) when its lo is given.
  const uint16_t* x_lo = nullptr;  // [*, k] or null
  const uint16_t* w_lo = nullptr;  // [n_experts, n, k] or null
  GroupedGemmPath path = GroupedGemmPath::kAuto;
};
void launch_grouped_gemm(const GroupedGemmArgs& a, cudaStream_t stream);

// The kMma path (bf16 mma.sync, persistent over the (expert, row tile, column tile) list):
// needs k % 8 == 0, n % 8 == 0, 16-byte aligned x, w and y, no lo parts, n_experts <= 4096.
// Block tiles (rows x columns, warps): k128x128, 4 warps of 64 x 64 whose warps past a group's
// last row skip their MMAs; k128x128w4, the same without the skipping (m16 tiles alternating
// between the warp rows); k128x128w8, 8 warps of 64 x 32; k128x256, 8 warps of 64 x 64.
// kAuto: k128x256 while rows_per_expert <= kMmaWideTileMaxRows (groups of a few dozen rows:
// the step streams the active experts' weights, in half as many column tiles), else k128x128.
// Tests and benchmarks take all four.
enum class MmaTile : int32_t { kAuto = -1, k128x128 = 0, k128x128w4 = 1, k128x128w8 = 2, k128x256 = 3 };
// bench_moe_gemm / bench_moe_layer, Qwen3-30B-A3B experts (128, top 8): 128 x 256 is 0.348
// against 0.414 ms a layer at 512 tokens, 0.451 against 0.434 ms at 1024.
inline constexpr int32_t kMmaWideTileMaxRows = 512;
bool grouped_gemm_mma_fits(const GroupedGemmArgs& a);
void launch_grouped_gemm_mma(const GroupedGemmArgs& a, cudaStream_t stream, MmaTile tile = MmaTile::kAuto);

// out[t, :] = sum over j (ascending ids[t, j]) of weights[t, j] * y[slot_row[t * k + j], :].
struct MoeCombineArgs {
  const float* y;           // [n * k, hidden]
  const int32_t* ids;       // [n, k]
  const float* weights;     // [n, k]
  const int32_t* slot_row;  // [n * k]
  float* out;               // [n, hidden]
  int32_t n;
  int32_t k;                // <= 64
  int32_t hidden;
  // 0: 16-byte loads where hidden % 4 == 0 and y and out are 16-byte aligned (the same sums in
  // the same order); 1: the scalar kernel (the reference the tests compare against).
  int32_t reference = 0;
};
void launch_moe_combine(const MoeCombineArgs& a, cudaStream_t stream);

}  // namespace strata::cuda
