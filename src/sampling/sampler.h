// Sampler: the per-sequence state that turns each step's logits into a token: the processor
// pipeline of logits_processors.h (same fixed order, fused), a seeded xoshiro256** stream and
// the penalty history. Same params, seed, prompt and logits sequence -> same tokens on every
// build; save()/restore() carry the whole state, so a checkpointed generation continues
// exactly where it stopped.
//
// Owned by the engine thread; not thread-safe. sample() never modifies the caller's logits and
// allocates nothing once its scratch has grown (warm-up): 4 bytes per vocabulary entry for the
// processed row, plus candidate lists (8 bytes per candidate) that keep the largest size seen;
// a wide nucleus (top-p at high temperature) can make them vocabulary-sized.
//
// Cost per call at vocabulary V: greedy is one copy and one max pass; sampling adds a divide
// and an exp pass (vector_math.h) and a draw that skips 256-token blocks by their sums; top-k
// is O(V) selection plus a sort of k tokens; top-p without top-k is O(V) radix selection that
// sorts only the boundary range; min-p alone gathers the tokens within log(min_p) of the max.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/status.h"
#include "sampling/logits_processors.h"
#include "sampling/logprobs.h"
#include "sampling/rng.h"
#include "sampling/sampling_params.h"

namespace strata {

// A constrained-decoding token mask (grammar/matcher.h): bit id of words is set iff id may be
// sampled; ids >= n_ids are never sampled. Applied after the logit processors (bias,
// penalties) and before temperature, top-k, top-p and min-p.
struct TokenMask {
  const uint32_t* words = nullptr;  // [(n_ids + 31) / 32]
  int32_t n_ids = 0;
};

class Sampler {
 public:
  // Validates params against the model's logits width (validate_sampling_params). prompt: the
  // prompt ids, kept (as a set) only when a repetition penalty is on.
  static Result<Sampler> create(const SamplingParams& params, int32_t model_vocab,
                                std::span<const int32_t> prompt = {});

  // Draws the next token from logits[0, vocab) (f32, the model's row for this sequence). Never
  // returns an id >= params.vocab_limit. Greedy requests use no randomness; any other call
  // consumes exactly one 64-bit draw, whatever the filters keep. Does not record the token:
  // the engine calls accept() for what it emits. mask: null, or the ids allowed (at least one
  // of them below effective_vocab(vocab)).
  int32_t sample(const float* logits, int32_t vocab, const TokenMask* mask = nullptr);

  // Records an emitted token in the penalty history (also tokens fed back when resuming).
  void accept(int32_t token);

  // The distribution sample() draws from for these logits, written to probs[0, vocab) (zeros
  // for removed and padded ids; one-hot for greedy). Consumes no randomness. For exact
  // speculative acceptance and for tests.
  void distribution(const float* logits, int32_t vocab, float* probs, const TokenMask* mask = nullptr);

  // Consumes and returns the 64-bit draw the next non-greedy sample() would use, for a sampler
  // that runs elsewhere (backend/cuda/sampling.h documents how a draw maps to a token); the
  // stream and save() stay here. Greedy requests must not call it (sample() draws nothing).
  uint64_t next_draw() { return rng_.next_u64(); }
  // The penalty history as sample() applies it: distinct prompt + generated ids (only with a
  // repetition penalty) and (id, occurrences among generated tokens), one entry per id.
  std::span<const int32_t> seen_ids() const { return seen_; }
  std::span<const std::pair<int32_t, int32_t>> token_counts() const { return counts_; }

  // Raw-model logprobs of token and its top_n alternatives over the real vocabulary (see
  // logprobs.h); independent of the processors above.
  Status logprobs(const float* logits, int32_t vocab, int32_t token, int32_t top_n, TokenLogprobs* out) const;

  // The whole state (params, RNG, history) as a self-describing little-endian byte string.
  std::string save() const;
  // The same with the RNG at `rng` instead of its state now: a state rng_state() gave before
  // draws taken since for tokens not yet accepted (an overlapped step's draw ahead).
  std::string save(const Xoshiro256::State& rng) const;
  const Xoshiro256::State& rng_state() const { return rng_.state(); }
  // Errors (kCorrupt) name what is wrong: bad magic/version, truncation, trailing bytes,
  // duplicate or negative ids, out-of-range params.
  static Result<Sampler> restore(std::string_view bytes);

  const SamplingParams& params() const { return params_; }
  int64_t n_accepted() const { return n_accepted_; }
  // Number of logits that can be sampled from a row of width vocab: min(vocab, vocab_limit).
  int32_t effective_vocab(int32_t vocab) const;

 private:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

  // Copies logits into work_ with NaN -> -inf, applies bias, penalties and the mask; returns
  // the argmax (lowest id on ties) of the result over [0, n).
  int32_t prepare(const float* logits, int32_t n, const TokenMask* mask);
  // For a non-greedy request after prepare(): builds the kept set, either in row mode (work_
  // holds every weight; the kept tokens are the heavier()-order prefix up to the cut token
  // (cut_bits_, cut_id_), the whole row when cut_bits_ is -1) or as cand_[0, n_kept_) sorted by
  // heavier(). mass_ is the sum of the kept weights.
  void select(int32_t n, int32_t argmax);
  // Top-p without top-k over work_ (scaled logits, maximum m): finds the cut token by radix
  // selection; only the boundary range is gathered and sorted.
  void select_nucleus(int32_t n, float m);
  // The k-th largest of t[0, n) (with multiplicity), by radix counting and nth_element.
  float kth_largest(const float* t, int32_t n, int32_t k);
  int32_t draw(int32_t n);
  void add_seen(int32_t token);

  SamplingParams params_;
  Xoshiro256 rng_;
  int64_t n_accepted_ = 0;
  // Penalty history. seen_: distinct prompt + generated ids (only with a repetition penalty),
  // in first-seen order; counts_: (id, occurrences among generated tokens) in first-generated
  // order. The maps index them for accept(); iteration always runs over the vectors, so the
  // order (and the save() bytes) depend only on the token sequence.
  std::vector<int32_t> seen_;
  std::unordered_set<int32_t> seen_index_;
  std::vector<std::pair<int32_t, int32_t>> counts_;
  std::unordered_map<int32_t, size_t> count_index_;

  // Scratch, reused across calls.
  std::vector<float> work_;           // [n] processed logits, then scaled logits or weights
  std::vector<WeightedToken> cand_;   // candidates of the kept set
  std::vector<WeightedToken> edge_;   // the nucleus boundary range being refined (+1 slack)
  std::vector<float> heap_;           // top-k boundary range
  bool row_mode_ = false;
  int32_t cut_bits_ = -1;             // bits of the cut token's weight (row mode)
  int32_t cut_id_ = 0;                // id of the cut token (row mode)
  int32_t n_kept_ = 0;
  double mass_ = 0.0;                 // sum of the kept weights
};

}  // namespace strata
