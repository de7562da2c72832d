// bf16 GEMM through cuBLASLt with fp32 accumulation: y[m, n] = x[m, k] . W[n, k]^T, every
// matrix row-major (the checkpoint's layout for W: no repacking). The output is bf16 or f32.
// Algorithms are chosen by cuBLASLt's heuristic once per shape and cached; the workspace is
// given at creation (from the arena), so a GEMM never allocates.
// Batch-invariant mode (set_batch_invariant): one algorithm per (n, k, output type) for every
// m, without split-K, and no GEMV: an output row's arithmetic then does not depend on how many
// rows share the call (each element is one dot product in the algorithm's fixed k order).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "core/status.h"

namespace strata::cuda {

enum class GemmOut { kBF16, kF32 };

class Gemm {
 public:
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  static Result<std::unique_ptr<Gemm>> create(void* workspace, size_t workspace_bytes);

  // x [m, k] bf16, w [n, k] bf16, y [m, n] (bf16 or f32). Exits with file:line on a cuBLASLt
  // failure (shapes are the caller's invariant).
  void run(cudaStream_t stream, const uint16_t* x, const uint16_t* w, void* y, GemmOut out, int64_t m, int64_t n,
           int64_t k);
  // Up to this many rows m, run() streams the weights through launch_gemv_bf16 instead of
  // cuBLASLt (0: always cuBLASLt; at most kGemvMaxRows).
  void set_gemv_rows(int64_t rows) { gemv_rows_ = rows; }
  // From now on every (n, k, output type) takes the algorithm cuBLASLt's heuristic ranks first
  // at m = ref_m among those that run with one K split and no reduction and accept m = 1, and
  // keeps it for every m (an m it rejects exits with file:line); the GEMV is off. Call before
  // the first run() (plans made earlier are dropped).
  void set_batch_invariant(int64_t ref_m);
  bool batch_invariant() const { return invariant_ref_m_ > 0; }

 private:
  Gemm() = default;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan(int64_t m, int64_t n, int64_t k, GemmOut out);
  // The batch-invariant algorithm of (n, k, out), chosen on first use.
  const cublasLtMatmulAlgo_t& invariant_algo(const Plan& p, int64_t n, int64_t k, GemmOut out);
  void destroy_plans();

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int64_t gemv_rows_ = 2;  // 3 and 4 rows stay with cuBLASLt until the stream kernel is measured there
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, Plan> plans_;
  int64_t invariant_ref_m_ = 0;  // > 0: batch-invariant mode
  std::map<std::tuple<int64_t, int64_t, int>, cublasLtMatmulAlgo_t> invariant_algos_;
};

}  // namespace strata::cuda
