// StepBatch: one packed forward. Sequences' tokens lie back to back (no padding); each
// sequence reads and writes its KV through its block table and its recurrent state through
// its slot. Built by the engine's planner, consumed by Model::forward.
#pragma once

#include <cstdint>
#include <vector>

namespace strata {

struct SeqSpan {
  int32_t n_tokens = 0;        // tokens of this sequence in this step (contiguous in StepBatch::tokens)
  int32_t pos0 = 0;            // position of the first of them = tokens already cached
  std::vector<int32_t> block_table;  // KV block ids covering positions [0, pos0 + n_tokens)
  // Block ids of the sliding-window layers when they page apart from the full-attention ones
  // (KvStorage's window pools); entries of blocks wholly behind every window may be -1 (their
  // blocks went back to the pool; attention never reads them). Empty: those layers use block_table.
  std::vector<int32_t> window_block_table;
  // Delayed quantization: block_table entries [0, n_quant_blocks) are ids into the pools of
  // KvStorage::quant() (the sequence's older blocks, converted to a codec); later entries are
  // ids into the storage's own pools. Layers reading window_block_table ignore it.
  int32_t n_quant_blocks = 0;
  int32_t state_slot = -1;     // recurrent-state slot (hybrid families), -1 when none
  int32_t adapter = -1;        // LoRA slot of the model (Model::add_lora), -1: the base weights
  bool logits_last = true;     // produce logits for the span's last token
  bool logits_all = false;     // produce logits for every token of the span (prompt logprobs)
};

struct StepBatch {
  std::vector<int32_t> tokens;  // [n_tokens] packed over seqs in order
  std::vector<SeqSpan> seqs;

  int64_t n_tokens() const { return int64_t(tokens.size()); }
  // Rows of logits forward() writes, in order: per sequence, all its tokens (logits_all) or
  // its last token (logits_last) or none.
  int64_t n_logit_rows() const {
    int64_t n = 0;
    for (const auto& s : seqs) n += s.logits_all ? s.n_tokens : (s.logits_last ? 1 : 0);
    return n;
  }
};

}  // namespace strata
