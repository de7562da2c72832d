#include "backend/cuda/token_feed.h"

namespace strata::cuda {

namespace {

constexpr int kThreads = 256;

__global__ void merge_tokens_kernel(MergeTokensArgs a) {
  for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < a.n_rows; r += gridDim.x * blockDim.x) {
    const int32_t s = a.row_sample[r];
    a.tokens[r] = s >= 0 ? a.sampled[s] : a.argmax[r];
  }
}

__global__ void feed_tokens_kernel(FeedTokensArgs a) {
  const int32_t n = min(a.desc[0], a.capacity);
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const int32_t t = a.prev[a.desc[1 + i]];
    a.tokens[a.desc[1 + a.capacity + i]] = t >= 0 && t < a.vocab ? t : 0;
  }
  // A feed is taken once: the next step (maybe a graph replay) feeds nothing unless the host
  // uploads another.
  __syncthreads();
  if (threadIdx.x == 0) a.desc[0] = 0;
}

int blocks_for(int n) { return n <= 0 ? 0 : (n + kThreads - 1) / kThreads; }

}  // namespace

void launch_merge_tokens(const MergeTokensArgs& a, cudaStream_t stream) {
  if (a.n_rows <= 0) return;
  merge_tokens_kernel<<<blocks_for(a.n_rows), kThreads, 0, stream>>>(a);
}

void launch_feed_tokens(const FeedTokensArgs& a, cudaStream_t stream) {
  feed_tokens_kernel<<<1, kThreads, 0, stream>>>(a);
}

}  // namespace strata::cuda
