// Overlapped ("async") scheduling (EngineOptions::async_scheduling): while step n runs on the
// executor's device, the host commits n with a placeholder for each sampled token, plans step
// n+1, queues it with n's tokens fed on the device (TokenFeed), and only then waits for n's
// tokens (the one wait of a step), streams them and finishes the requests they end.
//
// Why the tokens are those of one step at a time:
// - Scheduler::commit hashes tokens [0, n_computed) only. A placeholder sits at n_computed (the
//   position the step's token takes) and is patched when that step is collected, which comes
//   before the next commit: no published hash ever covers a placeholder. A sequence preempted
//   while it holds one is not re-admitted in the same plan (Scheduler::schedule) and is patched
//   before the next plan, where admission hashes its tokens again.
// - A request whose token in step n is its max_tokens-th leaves the scheduler when n is
//   committed (no placeholder: it is not planned again), as it would one step at a time. One
//   that stops on EOS or a stop id is known only after n+1 was planned with it: its token in
//   n+1 is dropped when n+1 is collected. Its blocks went back when it finished; the device
//   runs steps in queue order, so a later step reusing them writes after n+1 has read them.
// - Device sampling draws come from each request's own RNG in its own order (a dropped
//   token's draw belongs to a request that has ended).
// Constrained rows overlap on an executor with device_masks(): the step is queued with
// masks_later, the previous step is collected (its tokens advance the matchers), and the rows'
// masks go to sample_enqueued() while the device runs the forward. Token fill needs a
// sequence's newest token before its next step is planned, so overlapped steps do not fill
// (the tokens are the same: a filled position is the one id its mask allows).
// Requests that need the newest token on the host before the next step (logprobs unless the
// executor computes them with the token: device_logprobs(), and penalties unless it adds the
// fed token to their history: device_penalties()) are host-bound: while one is live, steps run
// one at a time (step() collects the step in flight before planning). A step whose plan loads
// or saves recurrent state or wants host logits (prompt logprobs) runs alone: step() collects
// the step in flight after planning it, and drops the spans of requests that step ended.
#include <string>
#include <vector>

#include "core/check.h"
#include "core/log.h"
#include "engine/engine_core.h"

namespace strata {

namespace {
// What a sampled position holds until its token arrives: any id the executor accepts (it
// packs it and overwrites it on the device through the TokenFeed).
constexpr int32_t kPlaceholderToken = 0;
}  // namespace

void Engine::setup_overlap() {
  Core& c = *core_;
  // --kv-quant-start: the conversion is queued on the device behind the step in flight (the
  // blocks it reads are complete there) and ahead of the next one (which may reuse the exact
  // blocks it gives back); commit hashes computed positions only, so converted blocks publish
  // under real tokens. Window pools: commit gives back the blocks behind the next query's
  // window while the step that last reads them may still be in flight; whoever takes them
  // next writes in a later step, which the device runs after it.
  // KV tiers: an evicted block's demotion reads it behind the step in flight (which may still
  // write it) and ahead of the step about to be queued (which may overwrite it): the reads are
  // queued before that step (flush_demotions), on the device's queue or waiting for it. Promoted
  // blocks are installed behind the step in flight too (a block it still reads may have been
  // given back and taken by the promotion). Checkpoints: their blocks are read behind the
  // device's queue (CheckpointBlocks), and a checkpoint taken while the next token's draw is
  // already out records the RNG from before that draw (Active::ckpt_rng). Steps with spans that
  // load or save recurrent state or want every position's logits (prompt logprobs) run alone:
  // step() collects the step in flight first.
  // Speculation proposes from every sequence's committed tokens and verifies on the host's
  // logits: a step with drafts runs alone, after the one in flight; steps the cost model
  // leaves without drafts overlap (Engine::step).
  c.overlap = options_.async_scheduling && c.runner.supports_overlap() && c.runner.device_argmax();
}

void Engine::admit_overlap(Active& a) {
  const SamplingParams& p = a.sampler.params();
  const bool penalties = (p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) &&
                         !core_->runner.device_penalties();
  const bool on_device = argmax_only(a.req, a.sampler, core_->runner.vocab()) || core_->runner.device_sampling();
  const bool logprobs_on_device = a.req.logprobs < 0 || (core_->runner.device_sampling() && core_->runner.device_logprobs());
  // A grammar's mask needs the last token on the host: it overlaps only where the executor
  // takes masks after the step's forward is queued (masks_later).
  const bool grammar_on_device = a.req.grammar == nullptr || (core_->runner.device_masks() && core_->runner.device_sampling());
  a.device_only = core_->overlap && on_device && !penalties && logprobs_on_device && grammar_on_device;
  if (!a.device_only) ++core_->n_host_bound;
}

void Engine::step_overlapped(const StepPlan& plan) {
  Core& c = *core_;
  std::vector<uint8_t>& want = c.want_logits;
  std::vector<RowSample>& samples = c.row_samples;
  const bool device_sampling = c.runner.device_sampling();
  const int32_t vocab = c.runner.vocab();
  want.clear();
  samples.clear();
  std::vector<TokenFeed> feed;
  std::vector<uint64_t> ids;  // the spans' sequences: one may end before this step is committed
  ids.reserve(plan.spans.size());
  std::vector<std::pair<size_t, int32_t>> masked;  // (span, logit row) of constrained rows
  int32_t n_rows = 0;
  for (size_t i = 0; i < plan.spans.size(); ++i) {
    const ScheduledSpan& span = plan.spans[i];
    Active& a = *c.active.at(span.seq->id);
    ids.push_back(span.seq->id);
    STRATA_CHECK(!span.logits_all && !span.restore_state && !span.save_state, "an overlapped step has no host rows or state");
    if (a.pending_index >= 0) {
      STRATA_CHECK(span.sample && span.n_tokens == 1 && span.pos0 == a.pending_index,
                   "a placeholder is read only by the decode right after it");
      feed.push_back({int32_t(i), a.pending_row});
    }
    if (!span.sample) continue;
    ++n_rows;
    RowSample rs;
    if (!argmax_only(a.req, a.sampler, vocab)) {
      STRATA_CHECK(device_sampling, "a device-only request without argmax needs device sampling");
      rs.sampler = &a.sampler;
      if (!a.sampler.params().greedy()) {
        if (!a.ckpt_key.empty() && a.pending_index >= 0) {
          // The token in flight may be checkpointed when it arrives, after this draw.
          a.ckpt_rng = a.sampler.rng_state();
          a.ckpt_rng_gen = a.n_generated + 1;
        }
        rs.draw = a.sampler.next_draw();
      }
      rs.top_logprobs = a.req.logprobs;
    }
    if (a.matcher) {
      rs.mask_later = true;
      masked.emplace_back(i, n_rows - 1);
    }
    want.push_back(0);
    if (device_sampling) samples.push_back(rs);
  }
  const bool masks_later = !masked.empty();
  auto fail_step = [&](const std::exception& e) {
    log::error("step failed: {}", e.what());
    drain_pipeline();
    for (uint64_t id : ids) {
      auto it = c.active.find(id);
      if (it != c.active.end()) finish(*it->second, FinishReason::kError, std::string("step failed: ") + e.what());
    }
  };
  try {
    // Evicted blocks are read before this step may overwrite them.
    if (c.tiers) c.flush_demotions();
    c.runner.enqueue(plan, want, samples, feed, masks_later);
  } catch (const std::exception& e) {
    fail_step(e);
    return;
  }
  if (c.in_flight) ++c.stats.overlapped_steps;
  // The previous step's tokens: streamed, and the requests they end are finished.
  drain_pipeline();
  if (masks_later) {
    // Every matcher has taken its sequence's previous token: the masks of this step's rows,
    // computed while the device runs its forward. A row whose request has just ended samples
    // unmasked (its token is dropped below); one whose mask allows nothing draws -1.
    std::vector<TokenMask>& masks = c.step_masks;
    masks.assign(size_t(n_rows), TokenMask{});
    for (const auto& [span, row] : masked) {
      auto it = c.active.find(ids[span]);
      if (it == c.active.end()) continue;
      bool any = false;
      masks[size_t(row)] = next_mask(*it->second, &any);
    }
    try {
      c.runner.sample_enqueued(masks);
    } catch (const std::exception& e) {
      fail_step(e);
      return;
    }
  }
  // This step's positions are computed; each sampled token gets a placeholder.
  std::vector<Core::InFlightSample> pending;
  pending.reserve(size_t(n_rows));
  int32_t row = 0;
  for (size_t i = 0; i < plan.spans.size(); ++i) {
    const ScheduledSpan& span = plan.spans[i];
    const int32_t span_row = span.sample ? row++ : -1;
    auto it = c.active.find(ids[i]);
    if (it == c.active.end()) continue;  // ended by the previous step's token: this one is dropped
    Active& a = *it->second;
    c.sched.commit(span);
    if (!span.sample) continue;
    Core::InFlightSample s;
    s.seq_id = ids[i];
    s.row = span_row;
    if (a.n_generated + 1 >= a.req.max_tokens) {
      // Its last token: it leaves the scheduler now, before the next plan, as it would after
      // this step's commit one step at a time. The token is appended when it arrives.
      const double now = now_s();
      c.sched.finish(&a.seq, now, a.req.session_id.empty() ? 0.0 : now + options_.session_ttl_s);
    } else {
      s.index = a.seq.n_tokens();
      a.seq.tokens.push_back(kPlaceholderToken);
      a.pending_index = s.index;
      a.pending_row = span_row;
    }
    pending.push_back(s);
  }
  c.in_flight = std::move(pending);
}

void Engine::drain_pipeline() {
  Core& c = *core_;
  if (!c.in_flight) return;
  const std::vector<Core::InFlightSample> samples = std::move(*c.in_flight);
  c.in_flight.reset();
  const StepRows* rows = nullptr;
  std::string error;
  try {
    rows = &c.runner.collect();
  } catch (const std::exception& e) {
    log::error("step failed: {}", e.what());
    error = std::string("step failed: ") + e.what();
  }
  for (const auto& s : samples) {
    auto it = c.active.find(s.seq_id);
    if (it == c.active.end()) continue;  // cancelled while its step ran
    Active& a = *it->second;
    a.pending_index = -1;
    a.pending_row = -1;
    if (rows == nullptr) {
      finish(a, FinishReason::kError, error);
      continue;
    }
    const int32_t sampled = rows->sampled.empty() ? StepRows::kNotSampled : rows->sampled.at(size_t(s.row));
    const int32_t token = sampled != StepRows::kNotSampled ? sampled : rows->argmax.at(size_t(s.row));
    if (token < 0) {
      finish(a, FinishReason::kError, a.matcher ? kNoGrammarToken : "sampling failed: every logit of the row is -inf or NaN");
      continue;
    }
    if (s.index >= 0) {
      a.seq.tokens[size_t(s.index)] = token;
    } else {
      a.seq.tokens.push_back(token);
    }
    if (!accept_device_token(a, token)) continue;
    emit_token(a, token, nullptr, rows, size_t(s.row));
  }
}

}  // namespace strata
