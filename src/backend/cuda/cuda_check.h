// CUDA error handling. Two kinds of failure:
//  - a call that can fail on what a user asked for (an allocation too big for the card, no
//    device present) becomes an Error through cuda_status(), naming the call and file:line;
//  - a failure of a call that cannot fail in a correct program (a launch, an async copy on
//    memory we own) is fatal: STRATA_CUDA_CHECK prints file:line and the CUDA error and exits,
//    because the CUDA context is then unusable and no request can be served from it.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <string>

#include "core/status.h"

namespace strata::cuda {

[[noreturn]] void cuda_fatal(const char* file, int line, const char* expr, const std::string& what);

// The Error for a failed CUDA call (ErrorCode::kResourceExhausted for out-of-memory, else kInternal).
Error cuda_error(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace strata::cuda

#define STRATA_CUDA_CHECK(expr)                                                                 \
  do {                                                                                          \
    cudaError_t strata_cuda_err_ = (expr);                                                      \
    if (strata_cuda_err_ != cudaSuccess)                                                        \
      ::strata::cuda::cuda_fatal(__FILE__, __LINE__, #expr, cudaGetErrorString(strata_cuda_err_)); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here.
#define STRATA_CUDA_CHECK_LAUNCH() STRATA_CUDA_CHECK(cudaGetLastError())

#define STRATA_CUBLAS_CHECK(expr)                                                                    \
  do {                                                                                               \
    cublasStatus_t strata_cublas_st_ = (expr);                                                       \
    if (strata_cublas_st_ != CUBLAS_STATUS_SUCCESS)                                                  \
      ::strata::cuda::cuda_fatal(__FILE__, __LINE__, #expr, cublasLtGetStatusString(strata_cublas_st_)); \
  } while (0)

// Returns an Error from the enclosing function (returning Status or Result<T>) when a CUDA
// call fails.
#define STRATA_CUDA_RETURN_IF_ERROR(expr)                                                   \
  do {                                                                                      \
    cudaError_t strata_cuda_err_ = (expr);                                                  \
    if (strata_cuda_err_ != cudaSuccess)                                                    \
      return ::strata::cuda::cuda_error(strata_cuda_err_, #expr, __FILE__, __LINE__);       \
  } while (0)
