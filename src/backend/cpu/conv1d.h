// Causal depthwise conv1d over a token stream, carrying the last kernel-1 inputs between calls
// so that a prompt split into any number of calls (prefill chunks, then one token per decode
// step) produces the same outputs as one call. Used by the gated-DeltaNet layers on their
// concatenated q/k/v projections.
#pragma once

#include <cstdint>

#include "core/thread_pool.h"

namespace strata::cpu {

struct CausalConv1dArgs {
  const float* x;       // [n_tokens, x_stride] input; channel c of token t at x[t * x_stride + c]
  float* y;             // [n_tokens, channels] output; must not alias x
  float* state;         // [kernel - 1, channels] the inputs before x, oldest first; updated in place
  const float* weight;  // [channels, kernel]; tap kernel-1 multiplies the current token
  const float* bias;    // [channels] or null
  int64_t x_stride;     // floats between tokens of x (>= channels)
  int32_t n_tokens;
  int32_t channels;
  int32_t kernel;       // >= 1
  bool silu;            // apply silu to the output
};

// Threads over channels.
void causal_conv1d(ThreadPool& pool, const CausalConv1dArgs& a);

}  // namespace strata::cpu
