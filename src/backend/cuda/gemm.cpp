#include "backend/cuda/gemm.h"

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/family_kernels.h"
#include "backend/cuda/fp8.h"
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

// How cuBLASLt reads 128x128 weight block scales (Gemm::set_fp8_weight_scale_layout): bit 0
// k fastest, bit 1 the leading dimension rounded up to 4; -1 not known yet (the first
// enable_fp8 probes it).
int32_t g_w_layout = -1;

int64_t round4(int64_t v) { return (v + 3) / 4 * 4; }

// The position of block (nb, kb) of an [NB, KB] scale grid in `layout`, and the grid's size.
int64_t scale_index(int32_t layout, int64_t nb, int64_t kb, int64_t NB, int64_t KB) {
  const bool kf = (layout & 1) != 0, pad = (layout & 2) != 0;
  return kf ? nb * (pad ? round4(KB) : KB) + kb : kb * (pad ? round4(NB) : NB) + nb;
}
int64_t scale_elems(int32_t layout, int64_t NB, int64_t KB) {
  const bool kf = (layout & 1) != 0, pad = (layout & 2) != 0;
  return kf ? NB * (pad ? round4(KB) : KB) : KB * (pad ? round4(NB) : NB);
}

}  // namespace

void Gemm::set_fp8_weight_scale_layout(int32_t v) { g_w_layout = v; }
int32_t Gemm::fp8_weight_scale_layout() { return g_w_layout; }

void Gemm::destroy_plans() {
  for (auto& [key, p] : plans_) destroy_plan(p.desc, p.a, p.b, p.d);
  plans_.clear();
}

Gemm::~Gemm() {
  destroy_plans();
  for (auto& [key, p] : fp8_plans_) destroy_plan(p.desc, p.a, p.b, p.d);
  for (float* f : fp8_owned_) cudaFree(f);
  cudaFree(fp8_x_);
  cudaFree(fp8_x_scales_);
  cudaFree(fp8_tail_x_);
  cudaFree(fp8_tail_scales_);
  cudaFree(fp8_tail_y_);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

Status Gemm::enable_fp8(int64_t max_m, int64_t max_k, int64_t max_n) {
  if (fp8_x_ != nullptr) return Status();
  auto alloc = [](auto** p, size_t bytes) { return cudaMalloc(reinterpret_cast<void**>(p), bytes); };
  const int64_t kb = fp8_blocks(max_k);
  STRATA_CUDA_RETURN_IF_ERROR(alloc(&fp8_x_, size_t(max_m * max_k)));
  STRATA_CUDA_RETURN_IF_ERROR(alloc(&fp8_x_scales_, size_t(max_m * kb) * sizeof(float)));
  STRATA_CUDA_RETURN_IF_ERROR(alloc(&fp8_tail_x_, size_t(kFp8RowAlign * max_k)));
  STRATA_CUDA_RETURN_IF_ERROR(alloc(&fp8_tail_scales_, size_t(kFp8RowAlign * kb) * sizeof(float)));
  STRATA_CUDA_RETURN_IF_ERROR(alloc(&fp8_tail_y_, size_t(kFp8RowAlign * max_n) * sizeof(float)));
  fp8_max_m_ = max_m;
  fp8_max_k_ = max_k;
  fp8_max_n_ = max_n;
  if (g_w_layout < 0) return probe_fp8_layout();
  return Status();
}

// A 16 x 256 x 256 product of all-ones codes (e4m3 0x38) with activation scales 1 and eight
// distinct weight scales v: output column j sums the two scales of its block row as cuBLASLt
// reads them, 128 * (v[a] + v[b]); each candidate layout predicts other sums.
Status Gemm::probe_fp8_layout() {
  constexpr int64_t m = kFp8RowAlign, n = 256, k = 256;
  uint8_t* w = nullptr;
  float* ws = nullptr;
  float* y = nullptr;
  auto alloc = [](auto** p, size_t bytes) { return cudaMalloc(reinterpret_cast<void**>(p), bytes); };
  STRATA_CUDA_RETURN_IF_ERROR(alloc(&w, size_t(n * k)));
  STRATA_CUDA_RETURN_IF_ERROR(alloc(&ws, 8 * sizeof(float)));
  STRATA_CUDA_RETURN_IF_ERROR(alloc(&y, size_t(m * n) * sizeof(float)));
  const float v[8] = {1.0f, 2.0f, 16.0f, 32.0f, 4.0f, 8.0f, 64.0f, 128.0f};
  std::vector<float> ones(size_t(m * fp8_blocks(k)), 1.0f);
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(w, 0x38, size_t(n * k)));
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemset(fp8_tail_x_, 0x38, size_t(m * k)));
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(ws, v, sizeof(v), cudaMemcpyHostToDevice));
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(fp8_tail_scales_, ones.data(), ones.size() * sizeof(float), cudaMemcpyHostToDevice));
  lt_fp8(nullptr, fp8_plan(m, n, k, GemmOut::kF32), reinterpret_cast<const uint16_t*>(w), ws, fp8_tail_x_,
         fp8_tail_scales_, y);
  float got[2] = {0, 0};
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(&got[0], y, sizeof(float), cudaMemcpyDeviceToHost));
  STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(&got[1], y + n - 1, sizeof(float), cudaMemcpyDeviceToHost));
  cudaFree(w);
  cudaFree(ws);
  cudaFree(y);
  for (int32_t layout = 0; layout < 4; ++layout) {
    float want[2];
    for (int64_t nb = 0; nb < 2; ++nb) {
      want[nb] = 128.0f * (v[scale_index(layout, nb, 0, 2, 2)] + v[scale_index(layout, nb, 1, 2, 2)]);
    }
    if (got[0] == want[0] && got[1] == want[1]) {
      g_w_layout = layout;
      return Status();
    }
  }
  return make_error(ErrorCode::kInternal, "cuBLASLt's block-scaled FP8 matmul reads 128x128 scales in no known layout (probe gave " +
                                              std::to_string(got[0]) + ", " + std::to_string(got[1]) + ")");
}

Status Gemm::add_fp8(const uint16_t* w, const float* scales, int64_t n, int64_t k) {
  if (k % 16 != 0) {
    return make_error(ErrorCode::kUnsupported, "FP8 weights need k % 16 == 0 (k = " + std::to_string(k) + ")");
  }
  if (fp8_x_ == nullptr || n > fp8_max_n_ || k > fp8_max_k_) {
    return make_error(ErrorCode::kInternal, "Gemm::add_fp8 of " + std::to_string(n) + " x " + std::to_string(k) +
                                                " past enable_fp8's " + std::to_string(fp8_max_n_) + " x " + std::to_string(fp8_max_k_));
  }
  Fp8Weight f;
  f.scales = scales;
  f.lt_scales = scales;
  f.n = n;
  f.k = k;
  const int64_t NB = fp8_blocks(n), KB = fp8_blocks(k);
  if (g_w_layout != 1 && !(g_w_layout == 3 && KB % 4 == 0)) {
    // The checkpoint's row-major grid is not what cuBLASLt reads: a rearranged copy.
    std::vector<float> src(size_t(NB * KB)), dst(size_t(scale_elems(g_w_layout, NB, KB)), 0.0f);
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(src.data(), scales, src.size() * sizeof(float), cudaMemcpyDeviceToHost));
    for (int64_t nb = 0; nb < NB; ++nb)
      for (int64_t kb = 0; kb < KB; ++kb) dst[size_t(scale_index(g_w_layout, nb, kb, NB, KB))] = src[size_t(nb * KB + kb)];
    float* t = nullptr;
    STRATA_CUDA_RETURN_IF_ERROR(cudaMalloc(reinterpret_cast<void**>(&t), dst.size() * sizeof(float)));
    STRATA_CUDA_RETURN_IF_ERROR(cudaMemcpy(t, dst.data(), dst.size() * sizeof(float), cudaMemcpyHostToDevice));
    fp8_owned_.push_back(t);
    f.lt_scales = t;
  }
  fp8_[w] = f;
  return Status();
}

const float* Gemm::fp8_scales(const uint16_t* w) const {
  const auto it = fp8_.find(w);
  return it == fp8_.end() ? nullptr : it->second.scales;
}

// As plan(), with FP8 A and B and block scale modes (the scale pointers are set per run).
const Gemm::Plan& Gemm::fp8_plan(int64_t m, int64_t n, int64_t k, GemmOut out) {
  const auto key = std::make_tuple(m, n, k, int(out));
  auto it = fp8_plans_.find(key);
  if (it != fp8_plans_.end()) return it->second;
  Plan p = tn_plan(CUDA_R_8F_E4M3, m, n, k, out);
  const cublasLtMatmulMatrixScale_t am = CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  const cublasLtMatmulMatrixScale_t bm = CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &am, sizeof(am)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &bm, sizeof(bm)));
  // Placeholders for the heuristic (the real pointers are set before each matmul).
  const void* sa = fp8_x_scales_;
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sa, sizeof(sa)));
  p.algo = first_algo(p, "no block-scaled FP8 algorithm", m, n, k);
  return fp8_plans_.emplace(key, p).first->second;
}

void Gemm::lt_fp8(cudaStream_t stream, const Plan& p, const uint16_t* w, const float* w_scales, const uint8_t* x,
                  const float* x_scales, void* y) {
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &w_scales, sizeof(w_scales)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &x_scales, sizeof(x_scales)));
  const float alpha = 1.0f, beta = 0.0f;
  STRATA_CUBLAS_CHECK(cublasLtMatmul(handle_, p.desc, &alpha, w, p.a, x, p.b, &beta, y, p.d, y, p.d, &p.algo, workspace_,
                                     workspace_bytes_, stream));
}

// Rows m <= kGemvMaxRows: the FP8 GEMV. More: the first m - m % 16 rows (cuBLASLt's block-
// scaled path takes row counts in multiples of 16) straight into y, the rest padded with zero
// rows to 16 in the tail scratch and copied out.
void Gemm::run_fp8(cudaStream_t stream, const uint16_t* x, const Fp8Weight& w8, const uint16_t* w, void* y, GemmOut out,
                   int64_t m, int64_t n, int64_t k) {
  if (m <= kGemvMaxRows && invariant_ref_m_ == 0) {
    GemvArgs a{};
    a.x = x;
    a.w = w;
    a.y = y;
    a.m = m;
    a.n = n;
    a.k = k;
    a.out = out == GemmOut::kF32 ? GemvOut::kF32 : GemvOut::kBF16;
    a.w_scale = w8.scales;
    a.w_scale_ld = fp8_blocks(k);
    launch_gemv(a, stream);
    return;
  }
  if (m > fp8_max_m_ || k > fp8_max_k_ || n > fp8_max_n_) {
    cuda_fatal(__FILE__, __LINE__, "Gemm::run", "FP8 GEMM of " + std::to_string(m) + " x " + std::to_string(n) + " x " +
                                                    std::to_string(k) + " past the scratch of enable_fp8");
  }
  // Activation scales m fastest (cuBLASLt's VEC128 layout): scales[g * rows + r].
  const int64_t m1 = m / kFp8RowAlign * kFp8RowAlign, tail = m - m1;
  if (m1 > 0) {
    launch_quantize_fp8_rows(x, fp8_x_, fp8_x_scales_, m1, k, 1, m1, stream);
    lt_fp8(stream, fp8_plan(m1, n, k, out), w, w8.lt_scales, fp8_x_, fp8_x_scales_, y);
  }
  if (tail > 0) {
    const int64_t kb = fp8_blocks(k);
    STRATA_CUDA_CHECK(cudaMemsetAsync(fp8_tail_x_, 0, size_t(kFp8RowAlign * k), stream));
    STRATA_CUDA_CHECK(cudaMemsetAsync(fp8_tail_scales_, 0, size_t(kFp8RowAlign * kb) * sizeof(float), stream));
    launch_quantize_fp8_rows(x + m1 * k, fp8_tail_x_, fp8_tail_scales_, tail, k, 1, kFp8RowAlign, stream);
    lt_fp8(stream, fp8_plan(kFp8RowAlign, n, k, out), w, w8.lt_scales, fp8_tail_x_, fp8_tail_scales_, fp8_tail_y_);
    const size_t es = out == GemmOut::kF32 ? 4 : 2;
    STRATA_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(y) + size_t(m1 * n) * es, fp8_tail_y_, size_t(tail * n) * es,
                                      cudaMemcpyDeviceToDevice, stream));
  }
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
  Plan p = tn_plan(CUDA_R_16BF, m, n, k, out);
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
  p.algo = first_algo(p, "no algorithm", m, n, k);
  return plans_.emplace(key, p).first->second;
}

Gemm::Plan Gemm::tn_plan(cudaDataType_t in, int64_t m, int64_t n, int64_t k, GemmOut out) const {
  Plan p;
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  STRATA_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, in, uint64_t(k), uint64_t(n), k));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, in, uint64_t(k), uint64_t(m), k));
  STRATA_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, out == GemmOut::kF32 ? CUDA_R_32F : CUDA_R_16BF, uint64_t(n),
                                                 uint64_t(m), n));
  return p;
}

cublasLtMatmulAlgo_t Gemm::first_algo(const Plan& p, const char* what, int64_t m, int64_t n, int64_t k) {
  cublasLtMatmulPreference_t pref = nullptr;
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  STRATA_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                           &workspace_bytes_, sizeof(workspace_bytes_)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(handle_, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
    cuda_fatal(__FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic",
               std::string(what) + " for m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) +
                   " (" + cublasLtGetStatusString(st) + ")");
  }
  return result.algo;
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
  if (!fp8_.empty()) {
    const auto it = fp8_.find(w);
    if (it != fp8_.end()) {
      run_fp8(stream, x, it->second, w, y, out, m, n, k);
      return;
    }
  }
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
