// The engine's speculative method: start-up checks, the proposer, drafting before each plan
// and committing a verify span (engine/speculative.h says what the method guarantees).
#include <algorithm>
#include <chrono>

#include "core/check.h"
#include "core/log.h"
#include "engine/draft_model_proposer.h"
#include "engine/engine.h"
#include "engine/engine_core.h"
#include "engine/ngram_proposer.h"

namespace strata {

namespace {
// Drafts at most, for families with recurrent state: a verify of k + 1 < 16 rows.
constexpr int32_t kMaxRecurrentDraft = 14;
}  // namespace

Status Engine::check_speculative(const Model& model, const EngineOptions& o, const StepExecutor* executor) {
  const SpeculativeOptions& s = o.speculative;
  auto bad = [](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, m); };
  if ((s.method == "external") != (s.proposer != nullptr)) {
    return bad("speculative method 'external' goes with a proposer, and only it");
  }
  auto method = s.proposer ? Result<SpecMethod>(SpecMethod::kNgram) : parse_spec_method(s.method);
  if (!method.ok()) return method.error();
  if (s.num_draft_tokens < 1 || s.num_draft_tokens > kMaxDraftTokens) {
    return bad("--num-draft-tokens must be in [1, " + std::to_string(kMaxDraftTokens) + "], got " +
               std::to_string(s.num_draft_tokens));
  }
  if (*method != SpecMethod::kDraft && (s.draft_model || !s.draft_model_dir.empty())) {
    return bad("--draft-model " + s.draft_model_dir + " needs --speculative draft (got --speculative " + s.method + ")");
  }
  if (*method == SpecMethod::kOff) return Status();
  const std::string flag = "--speculative " + s.method;
  if (s.ngram_min < 1 || s.ngram_max < s.ngram_min) {
    return bad(flag + ": n-gram lengths must satisfy 1 <= min <= max, got " + std::to_string(s.ngram_min) + ".." +
               std::to_string(s.ngram_max));
  }
  if (executor != nullptr && !executor->verifies_drafts()) {
    return make_error(ErrorCode::kUnsupported, flag + ": this device's step executor cannot verify drafted tokens yet "
                                                      "(speculation runs on the CPU); use --speculative off");
  }
  if (*method == SpecMethod::kDraft) {
    if (!s.draft_model) return bad(flag + " needs --draft-model DIR");
    const int32_t max_len = o.max_model_len > 0 ? o.max_model_len : model.config().max_position;
    STRATA_RETURN_IF_ERROR(DraftModelProposer::check(s.draft_model.get(), s.draft_model_dir, model.config(), max_len));
  }
  return Status();
}

void Engine::setup_speculation() {
  const SpeculativeOptions& s = options_.speculative;
  if (s.proposer) {
    core_->proposer = s.proposer;
    return;
  }
  const SpecMethod method = parse_spec_method(s.method).value();
  if (method == SpecMethod::kNgram) {
    core_->proposer = std::make_unique<NgramProposer>(s.ngram_min, s.ngram_max);
  } else if (method == SpecMethod::kDraft) {
    int32_t blocks = s.draft_kv_blocks;
    if (blocks <= 0) {
      // Every running sequence at max_model_len, within the target's own KV byte budget.
      const int64_t bs = options_.block_size;
      const int64_t need = int64_t(options_.max_num_seqs) * ((max_model_len_ + kMaxDraftTokens + bs - 1) / bs);
      auto layout = resolve_kv_layout(*s.draft_model, KvCodecConfig{});
      const int64_t per_block = layout.ok() ? std::max<int64_t>(1, KvStorage::bytes_per_token(*layout) * bs) : 1;
      blocks = int32_t(std::clamp<int64_t>(std::min(need, options_.kv_cache_bytes / per_block), 2, int64_t(1) << 30));
    }
    auto p = DraftModelProposer::create(s.draft_model, s.draft_model_dir, model_->config(), max_model_len_, blocks,
                                        options_.block_size);
    if (!p.ok()) throw std::invalid_argument(p.error().message);
    log::info("speculative decoding: draft model {} ({} KV blocks), up to {} drafts per verify", s.draft_model_dir,
              (*p)->n_kv_blocks(), s.num_draft_tokens);
    core_->proposer = std::move(p).value();
  }
}

bool Engine::DraftChoice::any() const {
  return std::any_of(k.begin(), k.end(), [](int32_t x) { return x > 0; });
}

Engine::DraftChoice Engine::choose_drafts() const {
  const Core& c = *core_;
  DraftChoice d;
  // Every decoding row counts in the cost model; only speculating ones may draft.
  std::vector<double> rates;
  std::vector<uint8_t> probe;
  for (Sequence* seq : c.sched.running()) {
    if (seq->state != SeqState::kDecoding || seq->n_remaining() != 1 || seq->n_draft != 0) continue;
    Active* row = c.active.at(seq->id).get();
    const Active& a = *row;
    const int32_t left = a.req.max_tokens - a.n_generated - 1;  // the pending token emits one
    d.rows.push_back(row);
    rates.push_back(a.spec.rate(c.spec_pool.rate()));
    // Recurrent layers run a verify token by token only below 16 rows (cpu::gated_delta_rule).
    const int32_t cap = c.runner.state_floats() > 0 ? kMaxRecurrentDraft : kMaxDraftTokens;
    d.max_k.push_back(a.spec_on ? std::clamp(std::min(options_.speculative.num_draft_tokens, left), 0, cap) : 0);
    // Probes of every idle row fall on the same steps, so that a draft model serves them all
    // in one batch; their depth goes 1, 2, .. up to the row's cap from one probe to the next.
    const int32_t k_cap = d.max_k.back();
    const int32_t period = a.spec.probe_period;
    const bool probing = a.spec.idle_steps >= period && c.stats.steps % period == 0 && k_cap > 0;
    probe.push_back(probing ? uint8_t(1 + (c.stats.steps / kFirstProbe) % k_cap) : 0);
  }
  if (d.rows.empty()) return d;
  if (!options_.speculative.adaptive) {
    d.k = d.max_k;
  } else if (c.stats.steps - c.last_plain_step >= kPlainAfter) {
    d.k.assign(d.rows.size(), 0);  // a plain step, to keep its cost model current
  } else {
    d.k = choose_draft_lengths(rates, d.max_k, probe, c.spec_costs);
  }
  // A verify asks for k + 1 logit rows and every other sequence of the step for one at most:
  // drafts past the executor's rows go, from the longest draft down.
  const int64_t spare = std::max<int64_t>(c.runner.max_logit_rows() - int64_t(options_.max_num_seqs), 0);
  int64_t total = 0;
  for (int32_t x : d.k) total += x;
  for (; total > spare; --total) --*std::max_element(d.k.begin(), d.k.end());
  return d;
}

void Engine::propose_drafts(const DraftChoice& choice) {
  Core& c = *core_;
  c.draft_rows.clear();
  std::vector<Active*> drafting, probed;
  int32_t depth = 0, n_drafts = 0;
  for (size_t i = 0; i < choice.rows.size(); ++i) {
    Active& a = *choice.rows[i];
    if (!a.spec_on || choice.max_k[i] == 0) continue;
    if (choice.k[i] == 0) {
      ++a.spec.idle_steps;
      continue;
    }
    // A probe the row stays idle after backs off; drafting by choice brings the period back.
    if (a.spec.idle_steps >= a.spec.probe_period) {
      a.spec.probe_period = std::min(2 * a.spec.probe_period, kMaxProbePeriod);
      probed.push_back(&a);
    } else {
      a.spec.probe_period = kProbeAfter;
    }
    a.spec.idle_steps = 0;
    n_drafts += choice.k[i];
    c.draft_rows.push_back(DraftRow{a.seq.id, a.seq.tokens, choice.k[i]});
    drafting.push_back(&a);
    depth = std::max(depth, choice.k[i]);
  }
  if (c.draft_rows.empty()) return;
  const auto t0 = Clock::now();
  c.proposer->propose(c.draft_rows, &c.drafts);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  c.timed_step.excluded_s += s;
  if (!probed.empty() && !c.spec_costs.plain.empty()) {
    // A probe costs its drafting (a draft model first catches up on all the tokens since the
    // row last drafted) and its verify's excess over a plain step: the next one waits until
    // that is at most kProbeBudget of the plain steps between.
    const double plain = c.spec_costs.plain.at(double(choice.rows.size()));
    const StepCostModel& vm = c.spec_costs.verify.empty() ? c.spec_costs.plain : c.spec_costs.verify;
    const double verify = vm.at(double(choice.rows.size() + n_drafts));
    const double cost = s + std::max(0.0, verify - plain);
    int32_t gap = kFirstProbe;
    while (gap < kMaxProbeGap && double(gap) * kProbeBudget * plain < cost) gap *= 2;
    for (Active* a : probed) a->spec.probe_period = std::max(a->spec.probe_period, gap);
  }
  // A draft model's first forwards at a batch size allocate or capture a graph: a call with a
  // count of rows not run twice before says nothing of the steady cost (0 until one does: a
  // draft that looks free runs, and its next calls measure it).
  if (c.draft_calls[int32_t(drafting.size())]++ >= 2) c.spec_costs.draft_position.observe(s / double(depth));
  for (size_t i = 0; i < drafting.size(); ++i) {
    Sequence& seq = drafting[i]->seq;
    const auto& d = c.drafts[i];
    const size_t n = std::min(d.size(), size_t(c.draft_rows[i].max_k));
    seq.tokens.insert(seq.tokens.end(), d.begin(), d.begin() + std::ptrdiff_t(n));
    seq.n_draft = int32_t(n);
  }
}

void Engine::time_step_costs() {
  Core& c = *core_;
  const auto now = Clock::now();
  const Core::TimedStep& t = c.timed_step;
  const double s = std::chrono::duration<double>(now - t.start).count();
  if (t.kind == Core::TimedStep::kPlain) c.spec_costs.plain.observe(t.n_tokens, s - t.excluded_s);
  if (t.kind == Core::TimedStep::kVerify) c.spec_costs.verify.observe(t.n_tokens, s - t.excluded_s);
  c.timed_step = Core::TimedStep{Core::TimedStep::kNone, now, 0, 0.0};
}

void Engine::commit_verify(Active& a, const ScheduledSpan& span, const StepRows& rows, size_t first_row) {
  Core& c = *core_;
  Sequence& seq = a.seq;
  const int32_t vocab = c.runner.vocab();
  const int32_t k = span.n_draft;
  const size_t draft0 = size_t(span.pos0) + 1;  // seq.tokens[draft0 + j]: draft j
  // No host logits: the request's tokens are the argmax (argmax_only), the executor's greedy
  // tokens (device_argmax).
  const bool argmax = rows.host_row.at(first_row) < 0;
  auto row_logits = [&](int32_t r) -> const float* {
    if (argmax) return nullptr;
    const int32_t h = rows.host_row.at(first_row + size_t(r));
    STRATA_CHECK(h >= 0 && rows.logits != nullptr, "a verify row has host logits");
    return rows.logits + size_t(h) * size_t(vocab);
  };
  auto is_stop = [&](int32_t t) {
    return std::find(a.req.stop_ids.begin(), a.req.stop_ids.end(), t) != a.req.stop_ids.end() ||
           (!a.req.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), t) != eos_ids_.end());
  };
  // Row r scores the token after position pos0 + r. The request's sampler draws there exactly as
  // a plain decode would (same logits bits, same RNG draw, the history of every token before);
  // the run goes on while its draw equals the draft, and ends at a stop or max_tokens.
  std::vector<int32_t>& out = c.verify_tokens;
  out.clear();
  int32_t accepted = 0;
  // A constrained row draws each position under the mask of its matcher advanced through the
  // tokens drawn before it (engine_grammar.cpp): the run ends where the grammar completes, and
  // the matcher has then advanced by exactly the tokens committed below.
  for (int32_t r = 0; r <= k; ++r) {
    const int32_t t = argmax ? rows.argmax.at(first_row + size_t(r)) : sample_token(a, row_logits(r), vocab);
    if (t < 0) {
      if (out.empty()) {
        seq.tokens.resize(draft0);
        seq.n_draft = 0;
        c.sched.commit_verified(span, 1, c.runner.state_floats() > 0);
        finish(a, FinishReason::kError, "the grammar allows no token here (within the sampled vocabulary)");
        return;
      }
      break;  // the tokens before it are committed; the next step meets the same mask and fails there
    }
    a.sampler.accept(t);
    out.push_back(t);
    const bool match = r < k && t == seq.tokens[draft0 + size_t(r)];
    if (match) ++accepted;
    if (!match || is_stop(t) || a.n_generated + int32_t(out.size()) >= a.req.max_tokens ||
        (a.constrained() && a.matcher->is_complete())) {
      break;
    }
  }
  const int32_t m = int32_t(out.size()) - 1;  // out[0, m) are the accepted drafts 0..m-1
  seq.tokens.resize(draft0 + size_t(m));
  seq.n_draft = 0;
  // Recurrent state ran every drafted token: when some were rejected it goes back to before
  // the verify and the kept tokens run again in a later step (a replay), as plain decoding
  // computed them (spans of fewer than 16 rows run the recurrent layers token by token).
  const bool replay = c.runner.state_floats() > 0 && m + 1 < span.n_tokens;
  if (replay) c.runner.load_state(seq.state_slot, a.spec_state.data());
  c.sched.commit_verified(span, m + 1, replay);
  seq.tokens.push_back(out[size_t(m)]);
  a.spec_drafted += k;
  a.spec_accepted += accepted;
  a.spec.observe(k, accepted);
  c.spec_pool.observe(k, accepted);
  c.stats.spec_draft_tokens += k;
  c.stats.spec_accepted_tokens += accepted;
  ++c.stats.spec_verifies;
  ++c.stats.spec_accepted_hist[std::min(accepted, EngineStats::kMaxSpecHistogram)];
  const int32_t before = a.n_generated;
  for (int32_t j = 0; j <= m; ++j) {
    if (!emit_token(a, out[size_t(j)], row_logits(j), nullptr, 0, /*in_run=*/true, /*grammar_current=*/j == m)) {
      return;  // finished: `a` is gone
    }
  }
  if (!a.ckpt_key.empty() && a.n_generated / options_.checkpoint_every > before / options_.checkpoint_every) {
    write_checkpoint(a);
  }
  fill_forced(a);
}

}  // namespace strata
