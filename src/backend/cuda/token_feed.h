// Overlapped steps (CudaExecutor::enqueue): the two small kernels that pass one step's tokens
// to the next without the host. After a step, merge_tokens gathers each logit row's token (the
// device sampler's, or the argmax) into one buffer, copied back to the host; before the next
// step's layers, feed_tokens writes the tokens of that buffer into the step's token ids, right
// after its metadata upload.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace strata::cuda {

struct MergeTokensArgs {
  const int32_t* argmax = nullptr;      // [n_rows] greedy token of each logit row
  const int32_t* sampled = nullptr;     // [sampled rows] tokens of the device sampler (may be null)
  const int32_t* row_sample = nullptr;  // [n_rows] index into `sampled`, -1: the row's argmax
  int32_t* tokens = nullptr;            // [n_rows] out
  int32_t n_rows = 0;
};
void launch_merge_tokens(const MergeTokensArgs& a, cudaStream_t stream);

// Reads its count from the device, so a captured decode graph replays it with any feed:
// desc = [n, src[capacity], dst[capacity]], and tokens[dst[i]] = prev[src[i]] for i < n; then
// n is set to 0 (each feed is used by one step).
struct FeedTokensArgs {
  int32_t* desc = nullptr;        // [1 + 2 * capacity] on the device
  const int32_t* prev = nullptr;  // [previous step's rows] its merged tokens
  int32_t* tokens = nullptr;      // [step tokens] the step's token ids on the device
  int32_t capacity = 0;
  int32_t vocab = 0;              // ids outside [0, vocab) (a failed sample, whose request ends) become 0
};
void launch_feed_tokens(const FeedTokensArgs& a, cudaStream_t stream);

}  // namespace strata::cuda
