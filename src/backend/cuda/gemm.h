// bf16 GEMM through cuBLASLt with fp32 accumulation: y[m, n] = x[m, k] . W[n, k]^T, every
// matrix row-major (the checkpoint's layout for W: no repacking). The output is bf16 or f32.
// Algorithms are chosen by cuBLASLt's heuristic once per shape and cached; the workspace is
// given at creation (from the arena), so a GEMM never allocates.
// Split weights (add_residual): a matrix of an f32 checkpoint kept as two bf16 matrices, w = hi
// + lo (lo = bf16(w - hi)); run() with hi then computes x . hi^T + x . lo^T, two bf16 GEMMs
// accumulating in f32 into one output (beta = 1), and adds x_lo . hi^T when the input has a
// registered residual too (add_input_residual). bf16 outputs accumulate in an f32 scratch and
// are rounded once.
// FP8 weights (add_fp8, fp8.h): float8_e4m3fn codes with 128x128 block scales. Up to
// kGemvMaxRows rows stream them through the GEMV (half the bytes of bf16); more rows quantize x
// per token and 128-column group (dynamic, amax / 448) and run cuBLASLt's block-scaled FP8
// matmul (1x128 activation scales, 128x128 weight scales, f32 accumulation).
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
#include <unordered_map>
#include <vector>

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
  // From now on run() with weight `w` [n, k] also adds x . w_lo^T (w_lo [n, k] bf16, the part
  // of the checkpoint's matrix that w's bf16 rounding lost). Such runs never take the GEMV.
  void add_residual(const uint16_t* w, const uint16_t* w_lo) { residuals_[w] = w_lo; }
  // From now on run() with input `x` and a split weight also adds x_lo . hi^T (x_lo [m, k]
  // bf16, the part of the activation that x's bf16 rounding lost; the caller keeps it current).
  void add_input_residual(const uint16_t* x, const uint16_t* x_lo) { input_residuals_[x] = x_lo; }
  // f32 scratch [elems] where bf16-output runs of split weights accumulate (elems >= m * n).
  void set_residual_scratch(float* scratch, int64_t elems) {
    residual_scratch_ = scratch;
    residual_scratch_elems_ = elems;
  }
  bool has_residuals() const { return !residuals_.empty(); }

  // The scratch of FP8 GEMMs (activation codes and scales of up to max_m rows of max_k
  // columns, a 16-row tail of up to max_n outputs), allocated once; call before the first
  // add_fp8. The first call in a process also probes how cuBLASLt reads weight block scales.
  Status enable_fp8(int64_t max_m, int64_t max_k, int64_t max_n);
  // From now on run() with weight `w` reads it as FP8 codes [n, k] with `scales` [ceil(n /
  // 128), ceil(k / 128)] row-major (the checkpoint's weight_scale_inv); both stay the caller's.
  Status add_fp8(const uint16_t* w, const float* scales, int64_t n, int64_t k);
  // The scales of an FP8 weight (null: w is bf16).
  const float* fp8_scales(const uint16_t* w) const;
  // How cuBLASLt reads 128x128 weight scales: bit 0 k fastest (else n fastest), bit 1 the
  // leading dimension rounded up to 4 (a rearranged copy is kept unless the checkpoint's
  // row-major grid is it); -1 probe at the next enable_fp8 (the default). For the parity
  // test; call before enable_fp8 / add_fp8.
  static void set_fp8_weight_scale_layout(int32_t v);
  static int32_t fp8_weight_scale_layout();

 private:
  Gemm() = default;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan(int64_t m, int64_t n, int64_t k, GemmOut out);
  // The TN descriptor and layouts of y[m, n] = x[m, k] . W[n, k]^T with A and B of type `in`.
  Plan tn_plan(cudaDataType_t in, int64_t m, int64_t n, int64_t k, GemmOut out) const;
  // The heuristic's first algorithm for p within the workspace; exits naming `what` and the shape.
  cublasLtMatmulAlgo_t first_algo(const Plan& p, const char* what, int64_t m, int64_t n, int64_t k);
  // The batch-invariant algorithm of (n, k, out), chosen on first use.
  const cublasLtMatmulAlgo_t& invariant_algo(const Plan& p, int64_t n, int64_t k, GemmOut out);
  void destroy_plans();
  void matmul(cudaStream_t stream, const Plan& p, const uint16_t* x, const uint16_t* w, void* y, float beta);
  struct Fp8Weight {
    const float* scales = nullptr;     // row-major [ceil(n / 128), ceil(k / 128)]
    const float* lt_scales = nullptr;  // as cuBLASLt reads them (scales itself, or a transposed copy)
    int64_t n = 0, k = 0;
  };
  const Plan& fp8_plan(int64_t m, int64_t n, int64_t k, GemmOut out);
  Status probe_fp8_layout();
  void lt_fp8(cudaStream_t stream, const Plan& p, const uint16_t* w, const float* w_scales, const uint8_t* x,
              const float* x_scales, void* y);
  static constexpr int64_t kFp8RowAlign = 16;  // rows of a block-scaled cuBLASLt FP8 call
  void run_fp8(cudaStream_t stream, const uint16_t* x, const Fp8Weight& w8, const uint16_t* w, void* y, GemmOut out,
               int64_t m, int64_t n, int64_t k);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int64_t gemv_rows_ = 2;  // 3 and 4 rows stay with cuBLASLt until the stream kernel is measured there
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, Plan> plans_;
  int64_t invariant_ref_m_ = 0;  // > 0: batch-invariant mode
  std::map<std::tuple<int64_t, int64_t, int>, cublasLtMatmulAlgo_t> invariant_algos_;
  std::unordered_map<const uint16_t*, const uint16_t*> residuals_;        // hi -> lo (weights)
  std::unordered_map<const uint16_t*, const uint16_t*> input_residuals_;  // x -> x_lo (activations)
  float* residual_scratch_ = nullptr;
  int64_t residual_scratch_elems_ = 0;
  std::unordered_map<const uint16_t*, Fp8Weight> fp8_;
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, Plan> fp8_plans_;
  uint8_t* fp8_x_ = nullptr;     // [fp8_max_m_, fp8_max_k_] activation codes
  float* fp8_x_scales_ = nullptr;  // their group scales
  uint8_t* fp8_tail_x_ = nullptr;      // [16, fp8_max_k_] the rows past the last multiple of 16
  float* fp8_tail_scales_ = nullptr;
  float* fp8_tail_y_ = nullptr;        // [16, fp8_max_n_] their outputs (f32 or bf16)
  int64_t fp8_max_m_ = 0, fp8_max_k_ = 0, fp8_max_n_ = 0;
  std::vector<float*> fp8_owned_;  // transposed scale copies (device)
};

}  // namespace strata::cuda
