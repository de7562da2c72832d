// Sequence: what the scheduler knows of one request: its tokens, how many of them have KV,
// the blocks that hold it, and where it stands in the request state machine. The engine owns
// sequences (with their sampler and stream); the scheduler holds pointers to them.
//
// States: waiting -> prefilling -> decoding -> finished; a running sequence whose blocks are
// taken back becomes preempted (n_computed = 0, blocks and state slot freed) and waits to recompute, which
// goes through prefilling again. Any state can end in finished (stop, length, cancel, error).
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

enum class SeqState { kWaiting, kPrefilling, kDecoding, kPreempted, kFinished };

const char* seq_state_name(SeqState s);

struct Sequence {
  uint64_t id = 0;        // engine-internal, unique
  uint64_t arrival = 0;   // submission order (FCFS key, tie-break of priority)
  int32_t priority = 0;   // lower value first under the priority policy

  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int32_t n_prompt = 0;
  int32_t n_computed = 0;       // leading tokens whose KV is in `blocks`
  // Speculative method: the last n_draft entries of `tokens` are drafted, not yet verified. They
  // exist only between proposing and committing one step (the scheduler drops them from a
  // sequence it does not schedule as a decode); the committed tokens are tokens[0, n_tokens() - n_draft).
  int32_t n_draft = 0;
  std::vector<int32_t> blocks;  // block table, covers at least n_computed tokens
  std::vector<uint64_t> block_hashes;  // chained hashes of the full blocks of `tokens`
  int32_t n_published = 0;      // leading blocks already offered to the prefix index
  // --kv-quant-start: blocks[0, n_quant_blocks) are ids in the codec pool (converted blocks),
  // the rest ids in the exact pool (engine/kv_conversion.h).
  int32_t n_quant_blocks = 0;
  // Block table of the sliding-window layers (a KV pool of their own): entries [0, window_first)
  // are -1, their blocks lay wholly behind the window and went back to that pool.
  std::vector<int32_t> window_blocks;
  int32_t window_first = 0;
  int32_t state_slot = -1;      // recurrent-state slot while running (hybrid families), else -1
  int32_t adapter = -1;         // the model's LoRA slot (Model::add_lora), -1: the base weights
  // Salts block_hashes (0: the engine's prefix salt alone): a LoRA adapter's KV differs from the
  // base model's for the same tokens, so its blocks chain under a salt of their own.
  uint64_t hash_salt = 0;

  bool reuse_prefix = true;       // look the prompt up in the prefix cache on admission
  bool prompt_logprobs = false;   // wants logits at every prompt position
  int32_t prompt_logprob_pos = 0; // next prompt position whose logits are still needed
  int32_t cached_tokens = -1;     // prefix-cache hit at first admission; -1: not admitted yet
  int32_t n_preemptions = 0;      // times the scheduler preempted it (its KV released, recomputed later)

  SeqState state = SeqState::kWaiting;

  int32_t n_tokens() const { return int32_t(tokens.size()); }
  int32_t n_remaining() const { return n_tokens() - n_computed; }
  bool running() const { return state == SeqState::kPrefilling || state == SeqState::kDecoding; }
};

}  // namespace strata
