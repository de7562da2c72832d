// Sampling and logprobs on the GPU: one kernel launch turns a batch of f32 logits rows that
// are already on the device into one token per row, with the semantics of the host Sampler
// (sampling/sampler.h): the same processor order (vocab limit, logit bias, repetition,
// presence/frequency, temperature, top-k, top-p, min-p), greedy = argmax with the lowest id on
// ties, and the same kept distribution. The random stream stays on the host: the host Sampler
// draws the row's 64-bit value (Sampler::next_draw()) and passes it here, so seeds, the
// one-draw-per-sample rule and checkpoints are unchanged.
//
// How a draw maps to a token (the host's Sampler::sample does the same in double precision):
// u = (draw >> 11) * 2^-53 in [0, 1); target = u * mass of the kept set; the token is the
// first one, walking the kept set in the host's order, whose running mass exceeds target. The
// host walks in id order when there is no top-k and either top-p is on or no filter is (its
// "row mode"), and in probability order (weight descending, id ascending) when top-k is on or
// min-p is on without top-p. The device keeps masses as exact 64-bit fixed-point sums
// (2^-40 units of a weight in [0, 1]), so it agrees with the host except where the draw lands
// within rounding (about 1e-7 of the mass) of a boundary between two tokens.
//
// Logprobs are those of sampling/logprobs.h: log_softmax of the raw logits over
// [0, min(vocab, vocab_limit)), NaN as -inf, independent of every processor.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>


namespace strata::cuda {

inline constexpr int32_t kSamplingMaxVocab = 262144;
inline constexpr int32_t kSamplingMaxTopLogprobs = 20;

// Per-row parameters (an array of these lives on the device). Penalty and bias lists are
// ranges [begin, begin + count) into the batch-wide arrays of SamplingBatch.
struct SamplingRow {
  float temperature = 1.0f;         // <= 0: greedy
  int32_t top_k = 0;                // <= 0 or >= the row's vocabulary: off
  float top_p = 1.0f;               // >= 1: off
  float min_p = 0.0f;               // <= 0: off
  float repetition_penalty = 1.0f;  // 1: off
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t vocab_limit = 0;          // 0: every column of the row is a token
  uint64_t draw = 0;                // the host's 64-bit draw (unused by greedy rows)
  int32_t bias_begin = 0;           // logit_bias entries, applied in order (ids may repeat)
  int32_t bias_count = 0;
  int32_t seen_begin = 0;           // distinct ids of prompt + generated tokens (repetition)
  int32_t seen_count = 0;
  int32_t counts_begin = 0;         // distinct (id, occurrences among generated tokens)
  int32_t counts_count = 0;
  int32_t top_logprobs = -1;        // -1: no logprobs for this row; 0..20: chosen + that many
  // Overlapped steps: index into SamplingBatch::pending_tokens of a token the row's sequence
  // generated in the previous step that its lists above do not hold yet (the host has not
  // seen it). The penalties count it once more: seen by repetition, and one more occurrence
  // for presence/frequency. -1: the lists are complete.
  int32_t pending = -1;
  // Constrained decoding: row of SamplingBatch::masks holding the ids this row may take (bit i
  // of word i / 32), applied after bias and penalties and before temperature and the filters,
  // as the host Sampler's TokenMask; ids the mask leaves out are -inf. -1: no mask.
  int32_t mask = -1;
};

struct SamplingBatch {
  const float* logits = nullptr;   // [n_rows, logits_stride], the first vocab columns used
  int64_t logits_stride = 0;       // floats between rows, >= vocab
  int32_t n_rows = 0;              // <= the max_rows of the workspace
  int32_t vocab = 0;               // <= kSamplingMaxVocab and the vocab of the workspace
  const SamplingRow* rows = nullptr;       // [n_rows] device
  const int32_t* bias_ids = nullptr;       // device, indexed by the rows' bias ranges
  const float* bias_values = nullptr;
  const int32_t* seen_ids = nullptr;       // device, indexed by the rows' seen ranges
  const int32_t* count_ids = nullptr;      // device, indexed by the rows' counts ranges
  const int32_t* count_values = nullptr;
  const int32_t* pending_tokens = nullptr;  // device, indexed by the rows' pending (may be null);
                                            // ids outside the row's vocabulary add nothing
  const uint32_t* masks = nullptr; // device [rows with a mask, mask_words], indexed by the rows' mask
  int32_t mask_words = 0;          // words per mask row, >= (vocab + 31) / 32
  int32_t* tokens = nullptr;       // [n_rows] out: the sampled token; -1 where every logit of
                                   // the row's vocabulary is -inf or NaN (the host refuses those)
  // Logprobs, written for rows with top_logprobs >= 0 (may be null when no row asks):
  float* chosen_logprob = nullptr; // [n_rows] logprob of the sampled token
  int32_t* top_ids = nullptr;      // [n_rows, kSamplingMaxTopLogprobs]: the top_logprobs best,
  float* top_logprob = nullptr;    //   logprob descending then id ascending; the rest -1 / -inf
  // Optional, for tests and exact speculative acceptance: the kept distribution of every row,
  // as Sampler::distribution gives it (one-hot for greedy rows; zeros past the vocab limit).
  float* probs = nullptr;          // [n_rows, vocab] or null
  void* workspace = nullptr;       // sampling_workspace_bytes(max_rows, vocab) bytes, 16-aligned
  size_t workspace_bytes = 0;
};

// Device scratch for batches of up to max_rows rows of width up to vocab (one processed row
// per batch row). Nothing is allocated per launch.
size_t sampling_workspace_bytes(int32_t max_rows, int32_t vocab);

// One kernel, one block per row; launched with programmatic dependent launch (pdl.cuh), so it
// may follow the logits kernel directly. The caller checks the batch against the workspace.
void launch_sampling(const SamplingBatch& batch, cudaStream_t stream);

// Process-wide, for tests and benchmarks: rows whose tokens of nonzero weight number at most
// 2048 (top-k, peaked rows) finish from a list sorted in shared memory instead of further
// passes over the row. On by default; both ways give the same tokens and distribution.
void set_sampling_compact(bool on);

}  // namespace strata::cuda
