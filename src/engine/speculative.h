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
// accepted over tried drafts (its prior: every sequence's rate, itself from a prior of 1/2);
// with k drafts a verify emits
// 1 + alpha + ... + alpha^k tokens on average, so a k-th draft adds alpha^k. Three measured
// costs price a step (StepCosts): a plain decode step of n tokens, plain(n) = a + b n; a step
// with drafts, verify(n) = a' + b' n, a regime of its own (a verify of k + 1 rows runs as a
// prefill chunk where a plain decode streams its weights once through a GEMV); and one draft
// position, c: a draft model's forward drafts that position for every drafting row at once, so
// drafting to depth D costs D c however many rows draft. Each is fitted on the engine's own
// steps, from one step's start to the next (host work and overlap included; the drafting
// seconds, and the wait for a step queued before, leave the verify's). For each depth D the
// best drafts are the largest expected gains (one at a time, while gain / b' exceeds the tokens
// per second modelled so far, each row capped at D), and the step takes the depth whose
// modelled throughput is highest, or no drafts at all when plain(n) does better than every
// depth: speculation never models slower than plain decoding, and a batch where it does not
// pay runs plain (overlapped) steps.
//
// Probes. A row left at 0 for its probe period P (kFirstProbe for a new row) drafts on the next
// step whose number is a multiple of P (rows of one period together, so that a draft model
// serves them in one batch), so its rate can recover: one token on the first probe, more on
// each next one up to its cap and around again, so that verify(n) is measured at several n
// while speculation pays nowhere (its slope is what prices a deeper draft). A probe after which
// the row stays idle doubles its P, up to kMaxProbePeriod, and makes it at least the power of
// two that keeps probes within kProbeBudget of the time (up to kMaxProbeGap): a probe costs its
// drafting, where a draft model first catches up on every token since the row last drafted,
// and its verify's excess over a plain step. A row that drafts by choice goes back to
// kProbeAfter. When no plain step has run for kPlainAfter steps, the next one is plain,
// so that plain(n) follows the batch too.
#pragma once

#include <algorithm>
#include <cmath>
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

inline constexpr int32_t kFirstProbe = 8;
inline constexpr int32_t kProbeAfter = 32;
inline constexpr int32_t kMaxProbePeriod = 256;
inline constexpr double kProbeBudget = 0.02;  // of the time, at most, that probes may cost
inline constexpr int32_t kMaxProbeGap = 4096;
inline constexpr int32_t kPlainAfter = 128;

// One sequence's acceptance, decaying so that it follows the text; or (decay 0.995) every
// sequence's, the prior a sequence's own few tries are weighed against (kPriorWeight tries of
// it), so that one lucky probe does not make a row look good.
struct AcceptanceStats {
  static constexpr double kPriorWeight = 4.0;
  double decay = 0.9;
  double accepted = 0.0;  // decayed accepted drafts
  double tried = 0.0;     // decayed drafts tried (accepted ones plus the first rejected one)
  int32_t idle_steps = 0; // consecutive steps the sequence drafted nothing
  int32_t probe_period = kFirstProbe;  // a new row learns its rate soon

  void observe(int32_t n_drafted, int32_t n_accepted);
  double rate(double prior = 0.5) const { return (accepted + kPriorWeight * prior) / (tried + kPriorWeight); }
};

// t(n) = a + b n over the engine's steps (seconds, n = the step's tokens).
class StepCostModel {
 public:
  static constexpr double kDecay = 0.98;
  void observe(int32_t n_tokens, double seconds);
  bool empty() const { return w_ <= 0.0; }
  double fixed_s() const;      // a
  double per_token_s() const;  // b
  double at(double n) const { return fixed_s() + per_token_s() * n; }

 private:
  double w_ = 0.0, sn_ = 0.0, snn_ = 0.0, sy_ = 0.0, sny_ = 0.0;  // decayed weight and moments
};

// The least of the latest kWindow observations: the steady cost of a draft position, which a
// cold call (a first forward's allocations or graph capture) or a draft model catching up on a
// sequence's context (a prefill in its first forward) only adds to, and which a window this
// short still follows when it rises for good (more rows drafting).
class RecentMin {
 public:
  static constexpr size_t kWindow = 8;
  void observe(double x) {
    if (!(x >= 0.0) || !std::isfinite(x)) return;
    last_[n_++ % kWindow] = x;
  }
  double value() const {
    double m = 0.0;
    for (size_t i = 0; i < std::min(n_, kWindow); ++i) m = i == 0 ? last_[i] : std::min(m, last_[i]);
    return m;
  }

 private:
  double last_[kWindow] = {};
  size_t n_ = 0;
};

struct StepCosts {
  StepCostModel plain;    // decode steps without drafts
  StepCostModel verify;   // decode steps with drafts, the drafting excluded
  RecentMin draft_position;  // one draft position for all drafting rows (0: free, as n-gram lookup)
};

// Drafts per row: k[i] in [0, max_k[i]], chosen as the header says. rates[i]: the row's
// acceptance rate; probe[i]: the row drafts at least min(probe[i], max_k[i]) tokens.
std::vector<int32_t> choose_draft_lengths(std::span<const double> rates, std::span<const int32_t> max_k,
                                          std::span<const uint8_t> probe, const StepCosts& costs);

// The modelled tokens per second of a step whose rows draft k[i] (all 0: a plain step).
double modelled_step_rate(std::span<const double> rates, std::span<const int32_t> k, const StepCosts& costs);

}  // namespace strata
