// bf16 GEMM through cuBLASLt with fp32 accumulation: y[m, n] = x[m, k] . W[n, k]^T, every
// matrix row-major (the checkpoint's layout for W: no repacking). The output is bf16 or f32.
// Algorithms are chosen by cuBLASLt's heuristic once per shape and cached; the workspace is
// given at creation (from the arena), so a GEMM never allocates.
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

 private:
  Gemm() = default;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan(int64_t m, int64_t n, int64_t k, GemmOut out);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int64_t gemv_rows_ = 2;  // 3 and 4 rows stay with cuBLASLt until the stream kernel is measured there
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, Plan> plans_;
};

}  // namespace strata::cuda
