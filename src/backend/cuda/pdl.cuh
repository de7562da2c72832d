// Programmatic dependent launch (Hopper): a kernel launched with launch_pdl may start while the
// kernel before it on the stream is still running. Its blocks become resident as soon as every
// block of the previous kernel has called pdl_launch_dependents (or exited), so they can read
// what no kernel writes (weights) and sit ready, instead of waiting for the previous grid to
// drain and for the launch after it.
//
// Rule for every kernel launched with launch_pdl: call pdl_wait() before the first read of
// anything an earlier kernel wrote and before the first global write. pdl_wait returns once the
// previous grid has completed and its writes are visible; since that grid waited the same way,
// every earlier kernel on the stream has completed too. Kernels call pdl_launch_dependents()
// right after their wait, so at most one grid waits behind the running one.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/kernels.h"

namespace strata::cuda {

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

// Launches kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream
// serialization allowed (see above) when launch_tuning().pdl, and checks the launch.
template <typename... Params, typename... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = launch_tuning().pdl ? 1 : 0;
  STRATA_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}

}  // namespace strata::cuda
