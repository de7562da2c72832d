#include "backend/cuda/gemm.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/family_kernels.h"
#include "backend/cuda/kernels.h"

#include <string>
#include <utility>

namespace strata::cuda {

namespace {

void destroy_plan(cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d) {
  cublasLtMatrixLayoutDestroy(a);
  cublasLtMatrixLayoutDestroy(b);
  cublasLtMatrixLayoutDestroy(d);
  cublasLtMatmulDescDestroy(desc);
}

}  // namespace

void Gemm::destroy_plans() {
  for (auto& [key, p] : plans_) destroy_plan(p.desc, p.a, p.b, p.d);
  plans_.clear();
}

Gemm::~Gemm() {
  destroy_plans();
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

void Gemm::set_batch_invariant(int64_t ref_m) {
  invariant_ref_m_ = ref_m > 0 ? ref_m : 1;
  gemv_rows_ = 0;
  destroy_plans();
  invariant_algos_.clear();
}

Result<std::unique_ptr<Gemm>> Gemm::create(void* workspace, size_t workspace_bytes) {
  std::unique_ptr<Gemm> g(new Gemm());
  const cublasStatus_t st = cublasLtCreate(&g->handle_);
  if (st != CUBLAS_STATUS_SUCCESS) {
    return make_error(ErrorCode::kInternal, std::string("cublasLtCreate failed: ") + cublasLtGetStatusString(st));
  }
  g->workspace_ = workspace;
  g->workspace_bytes_ = workspace_bytes;
  return g;
}

// Row-major y[m, n] = x[m, k] W[n, k]^T is, in cuBLAS's column-major view, D[n, m] = A^T B with
// A = W seen as a [k, n] column-major matrix and B = x seen as [k, m]: the "TN" case.
const Gemm::Plan& Gemm::plan(int64_t m, int64_t n, int64_t k, GemmOut out) {
  const auto key = std::make_tuple(m, n, k, int(out));
  auto it = plans_.find(key);
  if (it != plans_.end()) return it->second;
  Plan p;
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, uint64_t(k), uint64_t(n), k));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, uint64_t(k), uint64_t(m), k));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, out == GemmOut::kF32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(n),
                                                 uint64_t(m), n));
  if (invariant_ref_m_ > 0) {
    p.algo = invariant_algo(p, n, k, out);
    cublasLtMatmulHeuristicResult_t check{};
    const cublasStatus_t st = cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, p.b, p.d, p.d, &p.algo, &check);
    if (st != CUBLAS_STATUS_SUCCESS || check.workspaceSize > workspace_bytes_) {
      cuda_fatal(__FILE__, __LINE__, "cublasLtMatmulAlgoCheck",
                 "the batch-invariant algorithm of n=" + std::to_string(n) + " k=" + std::to_string(k) +
                     " does not run at m=" + std::to_string(m));
    }
    return plans_.emplace(key, p).first->second;
  }
  cublasLtMatmulPreference_t pref = nullptr;
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_bytes_, sizeof(workspace_bytes_)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  STRATA_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found));
  cublasLtMatmulPreferenceDestroy(pref);
  if (found == 0) {
    cuda_fatal(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic",
               "no algorithm for m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

// Candidates come from the heuristic at m = ref_m with the reduction schemes masked off (no
// split-K among them); each is pinned to one K split and no reduction, then must pass
// cublasLtMatmulAlgoCheck at ref_m and at m = 1 within the workspace.
const cublasLtMatmulAlgo_t& Gemm::invariant_algo(const Plan& p, int64_t n, int64_t k, GemmOut out) {
  const auto key = std::make_tuple(n, k, int(out));
  auto it = invariant_algos_.find(key);
  if (it != invariant_algos_.end()) return it->second;
  auto layout_b = [&](int64_t m) {
    cublasLtMatrixLayout_t b = nullptr, d = nullptr;
    STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&b, CUDA_R_16BF, uint64_t(k), uint64_t(m), k));
    STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d, out == GemmOut::kF32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(n),
                                                   uint64_t(m), n));
    return std::make_pair(b, d);
  };
  const auto [b_ref, d_ref] = layout_b(invariant_ref_m_);
  const auto [b_one, d_one] = layout_b(1);
  constexpr int kCandidates = 16;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  // With the mask first; should it leave nothing, unmasked (each candidate is pinned below).
  for (const bool masked : {true, false}) {
    cublasLtMatmulPreference_t pref = nullptr;
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                             &workspace_bytes_, sizeof(workspace_bytes_)));
    const uint32_t no_reduction = CUBLASLT_REDUCTION_SCHEME_NONE;
    if (masked) {
      STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK,
                                                               &no_reduction, sizeof(no_reduction)));
    }
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, b_ref, d_ref, d_ref, pref, kCandidates, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS) found = 0;
    if (found > 0) break;
  }
  bool chosen = false;
  cublasLtMatmulAlgo_t algo{};
  for (int i = 0; i < found && !chosen; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    cublasLtMatmulAlgo_t a = results[i].algo;
    const int32_t one_split = 1;
    const uint32_t none = CUBLASLT_REDUCTION_SCHEME_NONE;
    if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one_split, sizeof(one_split)) !=
            CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none, sizeof(none)) !=
            CUBLAS_STATUS_SUCCESS) {
      continue;
    }
    cublasLtMatmulHeuristicResult_t c_ref{}, c_one{};
    if (cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, b_ref, d_ref, d_ref, &a, &c_ref) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoCheck(handle_, p.desc, p.a, b_one, d_one, d_one, &a, &c_one) != CUBLAS_STATUS_SUCCESS ||
        c_ref.workspaceSize > workspace_bytes_ || c_one.workspaceSize > workspace_bytes_) {
      continue;
    }
    algo = a;
    chosen = true;
  }
  for (auto l : {b_ref, d_ref, b_one, d_one}) cublasLtMatrixLayoutDestroy(l);
  if (!chosen) {
    cuda_fatal(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic",
               "no batch-invariant algorithm (one K split, no reduction, m=1.." + std::to_string(invariant_ref_m_) +
                   ") for n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  return invariant_algos_.emplace(key, algo).first->second;
}

void Gemm::matmul(cudaStream_t stream, const Plan& p, const uint16_t* x, const uint16_t* w, void* y, float beta) {
  const float alpha = 1.0f;
  STRATA_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &p.algo, workspace_,
                                     workspace_bytes_, stream));
}

void Gemm::run(cudaStream_t stream, const uint16_t* x, const uint16_t* w, void* y, GemmOut out, int64_t m, int64_t n,
               int64_t k) {
  if (m == 0 || n == 0) return;
  if (!residuals_.empty()) {
    const auto it = residuals_.find(w);
    if (it != residuals_.end()) {
      // hi . x, then + lo . x (and + hi . x_lo), every product summed in f32 in one buffer.
      float* acc = static_cast<float*>(y);
      if (out == GemmOut::kBF16) {
        if (residual_scratch_ == nullptr || m * n > residual_scratch_elems_) {
          cuda_fatal(__FILE__, __LINE__, "Gemm::run",
                     "split-weight GEMM with a bf16 output of " + std::to_string(m) + " x " + std::to_string(n) +
                         " needs more f32 scratch than the " + std::to_string(residual_scratch_elems_) + " elements set");
        }
        acc = residual_scratch_;
      }
      const Plan& p = plan(m, n, k, GemmOut::kF32);
      matmul(stream, p, x, w, acc, 0.0f);
      matmul(stream, p, x, it->second, acc, 1.0f);
      const auto xi = input_residuals_.find(x);
      if (xi != input_residuals_.end()) matmul(stream, p, xi->second, w, acc, 1.0f);
      if (out == GemmOut::kBF16) launch_to_bf16(acc, static_cast<uint16_t*>(y), m * n, stream);
      return;
    }
  }
  // Decode rows: a plain weight stream (bench_cuda_llama measures it against cuBLASLt).
  if (m <= gemv_rows_ && invariant_ref_m_ == 0 && gemv_supports(x, w, m, k)) {
    launch_gemv_bf16(x, w, y, out == GemmOut::kF32, m, n, k, stream);
    return;
  }
  matmul(stream, plan(m, n, k, out), x, w, y, 0.0f);
}

}  // namespace strata::cuda
