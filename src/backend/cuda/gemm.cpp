#include "backend/cuda/gemm.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace strata::cuda {

Gemm::~Gemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.d);
    cublasLtMatmulDescDestroy(p.desc);
  }
  if (handle_ != nullptr) cublasLtDestroy(handle_);
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

void Gemm::run(cudaStream_t stream, const uint16_t* x, const uint16_t* w, void* y, GemmOut out, int64_t m, int64_t n,
               int64_t k) {
  if (m == 0 || n == 0) return;
  // Decode rows: a plain weight stream (bench_cuda_llama measures it against cuBLASLt).
  if (m <= gemv_rows_ && gemv_supports(x, w, m, k)) {
    launch_gemv_bf16(x, w, y, out == GemmOut::kF32, m, n, k, stream);
    return;
  }
  const Plan& p = plan(m, n, k, out);
  const float alpha = 1.0f, beta = 0.0f;
  STRATA_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &p.algo, workspace_,
                                     workspace_bytes_, stream));
}

}  // namespace strata::cuda
