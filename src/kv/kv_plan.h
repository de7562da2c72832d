// KvPlan: how a model's KV memory splits into its pools, the one rule every executor (the host
// ModelRunner, the CUDA decoder) and `strata inspect` size by. An executor describes what one
// token costs in each pool in its own row formats (KvPoolShape) and the limits it runs under
// (KvLimits); plan_kv_pools() answers the block count of every pool and the recurrent
// state slots. Devices first take their KV bytes from their memory (device_kv_bytes()).
//
// Pools:
// - the full-attention pool (every layer without a sliding window, or the only pool);
// - the sliding-window pool, when the model has both kinds of layer: what each sequence's
//   window needs (the keys one query reads behind it plus a block), max_num_seqs of them and
//   one step's tokens, at most an equal share of the bytes (a pool past what the windows need
//   buys only cache); a model of sliding layers only keeps the full pool as bookkeeping for
//   the prefix index (no bytes);
// - the codec pool of delayed quantization (quant_start > 0, engine/kv_conversion.h), for the
//   full-attention layers (sliding windows stay exact, their pool sized as without it): the
//   exact pool gets what the running sequences hold before conversion, max_num_seqs x
//   (ceil(N / block) + 1) blocks plus one step's tokens, at most half the bytes but never less
//   than one sequence's need (ceil((N + 1) / block) + 1); the rest goes to the codec pool at its
//   (smaller) bytes per token;
// - recurrent-state slots (hybrid families): one per running sequence.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace strata {

// What one token position costs in each pool, over the layers that own KV of that kind (a
// layer reading another's KV costs nothing), in the executor's row formats.
struct KvPoolShape {
  int64_t full_bytes_per_token = 0;    // full-attention layers (the exact rows when quant_start > 0)
  int64_t window_bytes_per_token = 0;  // sliding-window layers, when they page apart
  int32_t window = 0;                  // the largest sliding window in tokens (0: none)
  int64_t quant_bytes_per_token = 0;   // quant_start > 0: the full-attention layers in their codecs
  bool has_state = false;              // recurrent-state layers
};

// The limits of one step, declared once for every layer's options that run steps
// (EngineOptions, SchedulerOptions, the CUDA engine's).
struct StepLimits {
  int32_t max_batch_tokens = 2048;  // token budget of one step (decodes + prefill chunks)
  int32_t max_num_seqs = 64;        // sequences running at once
};

// What the KV pools are sized by, declared once for every executor's options (EngineOptions,
// the CUDA engine's). Errors name these as the flags that set them.
struct KvLimits : StepLimits {
  int64_t kv_cache_bytes = int64_t(512) << 20;  // bytes for every pool together
  int32_t kv_blocks = 0;         // > 0: exactly this many full-attention (or exact) blocks
  int32_t kv_window_blocks = 0;  // > 0: exactly this many sliding-window blocks
  int32_t kv_quant_blocks = 0;   // > 0 with --kv-quant-start: exactly this many codec blocks
  int32_t block_size = 16;       // tokens per KV block
  int32_t max_model_len = 0;     // prompt + max_tokens at most; 0: the model's max positions
};

struct KvPoolPlan {
  int32_t n_blocks = 0;         // the full-attention pool (the exact pool with quant_start)
  int32_t n_window_blocks = 0;  // the sliding-window pool, 0: none
  int32_t n_quant_blocks = 0;   // the codec pool, 0: none
  int32_t n_state_slots = 0;    // recurrent-state slots, 0: none
  // Bytes the pools take in `shape` (the state slots' bytes are the executor's).
  int64_t kv_bytes(const KvPoolShape& shape, int32_t block_size) const;
  // One line for logs and `strata inspect`: blocks and bytes of each pool.
  std::string describe(const KvPoolShape& shape, int32_t block_size) const;
};

// The pools for `shape` under `limits`, for sequences of at most max_len tokens (max_model_len
// resolved against the model) and --kv-quant-start quant_start (0: off). kInvalidArgument names
// the option and value when the bytes (or the explicit counts) cannot hold what one sequence
// needs.
Result<KvPoolPlan> plan_kv_pools(const KvPoolShape& shape, const KvLimits& limits, int32_t max_len, int32_t quant_start = 0);

// Bytes a device gives its KV pools: `fraction` of its `total` memory, less what is in use
// already (`total - free`: the context, other processes), the weights and step scratch
// (`fixed`) and `reserve` (handles, staging and what is taken after the pools). Errors name
// --gpu-memory-fraction and the sizes.
Result<int64_t> device_kv_bytes(double fraction, int64_t total, int64_t free, int64_t fixed, int64_t reserve);

}  // namespace strata
