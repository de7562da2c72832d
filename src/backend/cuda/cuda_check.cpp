#include "backend/cuda/cuda_check.h"

#include <cstdio>
#include <cstdlib>

namespace strata::cuda {

void cuda_fatal(const char* file, int line, const char* expr, const std::string& what) {
  std::fprintf(stderr, "%s:%d: CUDA call failed: %s: %s\n", file, line, expr, what.c_str());
  std::fflush(stderr);
  std::exit(3);
}

Error cuda_error(cudaError_t err, const char* expr, const char* file, int line) {
  cudaGetLastError();  // clear a sticky non-fatal error so the next call starts clean
  const ErrorCode code = err == cudaErrorMemoryAllocation ? ErrorCode::kResourceExhausted : ErrorCode::kInternal;
  return make_error(code, std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " +
                              cudaGetErrorString(err));
}

}  // namespace strata::cuda
