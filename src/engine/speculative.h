// The speculative method: its options, and the choice of how many tokens each speculating
// sequence drafts in a step (adaptive k). A speculating decode's span is its pending token plus
// k drafted ones (engine/proposer.h), verified in the step's packed forward with logits at every
// position; the engine keeps the longest prefix the request's own sampler agrees with plus the
// token the sampler drew after it, so outputs are those of plain decoding. Paged KV rolls back
// by forgetting positions; recurrent state (gated DeltaNet hybrids) is saved before a verify,
// restored when a draft token is rejected, and the kept tokens run again in a later step
// (snapshot + replay), with at most 14 drafts so that every verify and replay runs the
// recurrent layers token by token.
//
// Adaptive k. Each sequence's acceptance rate alpha is an exponentially decaying count of
// accepted over tried drafts (a prior of 1/2); with k drafts a verify emits
// 1 + alpha + ... + alpha^k tokens on average, so a k-th draft adds alpha^k. A step of n tokens
// is modelled as t(n) = a + b n, fitted on the engine's measured step times (ridge toward
// b = mean t / (mean n + 16) while the steps' sizes vary too little); a drafted token costs b
// plus the proposer's measured seconds per draft. Starting from k = 0 for every row (B rows:
// B tokens in t(B)), drafts are added one at a time, the one with the largest expected gain
// first, while gain / cost exceeds the tokens per second modelled so far: each addition raises
// the modelled throughput, so it never falls below plain decoding's. A row left at 0 for
// kProbeAfter steps drafts one token on the next step whose number is a multiple of
// kProbeAfter (all such rows together), so its rate can recover.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace strata {

class Model;
class Proposer;

enum class SpecMethod { kOff, kNgram, kDraft };
// "off" | "ngram" | "draft"; the error names --speculative and the value.
Result<SpecMethod> parse_spec_method(const std::string& s);

inline constexpr int32_t kMaxDraftTokens = 16;

struct SpeculativeOptions {
  std::string method = "off";   // --speculative off|ngram|draft
  int32_t num_draft_tokens = 4; // --num-draft-tokens K: drafts per verify at most, [1, 16]
  // --draft-model DIR (method draft): the directory, for messages, and its model, loaded by the
  // caller (same vocabulary as the target; a context at least max_model_len; no recurrent state).
  std::string draft_model_dir;
  std::shared_ptr<Model> draft_model;
  int32_t draft_kv_blocks = 0;  // the draft's own KV pool; 0: max_num_seqs sequences of max_model_len
  int32_t ngram_min = 1;        // prompt lookup matches the last n tokens, n from ngram_max down
  int32_t ngram_max = 4;
  bool adaptive = true;         // false: every speculating row drafts num_draft_tokens (tests)
  // method "external": this proposer (tests and benchmarks that script the drafts; no flag).
  std::shared_ptr<Proposer> proposer;
};

// One sequence's acceptance, decaying so that it follows the text.
struct AcceptanceStats {
  static constexpr double kDecay = 0.9;
  double accepted = 0.0;  // decayed accepted drafts
  double tried = 0.0;     // decayed drafts tried (accepted ones plus the first rejected one)
  int32_t idle_steps = 0; // consecutive steps the sequence drafted nothing

  void observe(int32_t n_drafted, int32_t n_accepted);
  double rate() const { return (accepted + 1.0) / (tried + 2.0); }
};

// t(n) = a + b n over the engine's steps (seconds, n = the step's tokens).
class StepCostModel {
 public:
  static constexpr double kDecay = 0.98;
  void observe(int32_t n_tokens, double seconds);
  bool empty() const { return w_ <= 0.0; }
  double fixed_s() const;      // a
  double per_token_s() const;  // b

 private:
  double w_ = 0.0, sn_ = 0.0, snn_ = 0.0, sy_ = 0.0, sny_ = 0.0;  // decayed weight and moments
};

inline constexpr int32_t kProbeAfter = 32;

// Drafts per row: k[i] in [0, max_k[i]], chosen as the header says. rates[i]: the row's
// acceptance rate; probe[i]: the row gets at least one draft (when max_k[i] > 0).
std::vector<int32_t> choose_draft_lengths(std::span<const double> rates, std::span<const int32_t> max_k,
                                          std::span<const uint8_t> probe, const StepCostModel& cost,
                                          double draft_s_per_token);

}  // namespace strata
