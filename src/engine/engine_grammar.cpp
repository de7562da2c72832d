// Constrained decoding in the engine: a request's grammar (GenerationRequest::grammar) becomes
// a per-sequence Matcher at admission; every sampled row of the request draws under the
// matcher's token mask (Sampler's TokenMask: after bias and penalties, before temperature and
// the filters) and the matcher advances by the committed token. An executor that samples on
// its device (device_masks()) takes the mask with the row (RowSample::mask): the row's logits
// stay there. In overlapped steps the mask of a row depends on the token its sequence drew in
// the step before, which reaches the host only after the row's step was queued: the step is
// queued with masks_later, the host collects the previous step, advances the matchers, fills
// the masks while the device runs the forward, and then queues the step's sampling
// (engine_async.cpp). A verify span draws each row
// under the mask of the matcher advanced through the tokens accepted before it, so the matcher
// only ever advances by committed tokens and a rejected draft needs no rollback. A checkpoint
// stores the generated ids; resuming replays them through a fresh matcher, which gives the
// state the uninterrupted run had (the matcher is a function of the tokens it accepted).
//
// Token fill (steps run one at a time; an overlapped step has planned the sequence's next
// decode before its token arrives): after a committed token, while the mask admits exactly one
// id (not a stop id), that id is appended without sampling; the next step runs the filled span and the pending
// token in one forward (the scheduler takes a decoding sequence's uncomputed tokens as a
// chunk) and samples only at its end. A filled position consumes the RNG draw and enters the
// penalty history as a sampled one would, so the output equals plain constrained decoding.
#include <bit>
#include <chrono>

#include "core/check.h"
#include "core/log.h"
#include "engine/engine.h"
#include "engine/engine_core.h"

namespace strata {

Status Engine::check_grammar(const GenerationRequest& r) const {
  if (r.grammar == nullptr) return Status();
  auto bad = [](const std::string& m) { return make_error(ErrorCode::kInvalidArgument, m); };
  const int32_t vocab = model_->config().vocab_size;
  const int32_t gv = r.grammar->vocab().size();
  if (gv > vocab) {
    return bad("grammar vocabulary of " + std::to_string(gv) + " ids is wider than the model's " + std::to_string(vocab));
  }
  if (r.grammar_key.empty()) return bad("grammar_key must name the grammar of a constrained request");
  return Status();
}

void Engine::admit_grammar(Active& a) {
  if (a.req.grammar == nullptr) return;
  // Only committed tokens advance the matcher (see above): it keeps no rollback history.
  a.matcher = std::make_unique<grammar::Matcher>(a.req.grammar, 0);
  a.grammar_wait = a.req.grammar_in_think;
  a.mask.assign(size_t(a.req.grammar->vocab().mask_words()), 0u);
  ++core_->stats.grammar_requests;
}

bool Engine::replay_grammar(Active& a, const std::vector<int32_t>& generated) {
  if (!a.matcher) return true;
  auto fail = [&] {
    a.matcher->reset();
    a.grammar_wait = a.req.grammar_in_think;
    return false;
  };
  for (size_t i = 0; i < generated.size(); ++i) {
    if (!grammar_take(a, generated[i], int32_t(i))) return fail();
  }
  if (a.constrained() && a.matcher->is_complete()) return fail();  // a complete output would have finished
  return true;
}

bool Engine::grammar_take(Active& a, int32_t token, int32_t position) {
  if (!a.matcher) return true;
  if (a.grammar_wait) {
    if (token == a.req.grammar_think_end) a.grammar_wait = false;
    return true;
  }
  if (position == 0 && token == a.req.grammar_think_open && token >= 0) {
    a.grammar_wait = true;
    return true;
  }
  return a.matcher->accept_token(token);
}

TokenMask Engine::next_mask(Active& a, bool* any) {
  *any = true;
  if (a.grammar_wait) return TokenMask{};  // reasoning: no constraint yet
  const auto t0 = Clock::now();
  a.matcher->fill_next_token_bitmask(a.mask.data());
  const int32_t n_ids = a.req.grammar->vocab().size();
  const int32_t open = a.req.grammar_think_open;
  if (a.n_generated == 0 && open >= 0 && open < n_ids) a.mask[size_t(open) / 32] |= 1u << (open % 32);
  // The row can be sampled only if the mask keeps an id the sampler may draw.
  const int32_t limit = std::min(n_ids, a.sampler.effective_vocab(core_->runner.vocab()));
  *any = false;
  for (int32_t w = 0; w * 32 < limit && !*any; ++w) {
    uint32_t bits = a.mask[size_t(w)];
    if ((w + 1) * 32 > limit) bits &= (limit - w * 32 >= 32) ? ~0u : ((1u << (limit - w * 32)) - 1u);
    *any = bits != 0;
  }
  core_->stats.grammar_mask.add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  return TokenMask{a.mask.data(), n_ids};
}

int32_t Engine::sample_token(Active& a, const float* logits, int32_t vocab) {
  if (!a.matcher) return a.sampler.sample(logits, vocab);
  bool any = false;
  const TokenMask mask = next_mask(a, &any);
  if (!any) return -1;
  const int32_t token = a.sampler.sample(logits, vocab, mask.words != nullptr ? &mask : nullptr);
  STRATA_CHECK(grammar_take(a, token, a.n_generated), "the grammar accepts the token its mask allowed (" + std::to_string(token) + ")");
  return token;
}

bool Engine::accept_device_token(Active& a, int32_t token) {
  if (grammar_take(a, token, a.n_generated)) return true;
  // The device drew under the mask the matcher gave: a token it rejects is a fault of the step.
  finish(a, FinishReason::kError, "the grammar rejects the device-sampled token " + std::to_string(token));
  return false;
}

int32_t Engine::only_allowed_token(Active& a) {
  const auto t0 = Clock::now();
  a.matcher->fill_next_token_bitmask(a.mask.data());
  const int32_t n_ids = std::min(a.req.grammar->vocab().size(), a.sampler.effective_vocab(core_->runner.vocab()));
  int32_t only = -1;
  for (int32_t w = 0; w * 32 < n_ids; ++w) {
    uint32_t bits = a.mask[size_t(w)];
    if ((w + 1) * 32 > n_ids) bits &= (1u << (n_ids - w * 32)) - 1u;
    if (bits == 0) continue;
    if (only >= 0 || (bits & (bits - 1)) != 0) {
      only = -1;
      break;
    }
    only = w * 32 + std::countr_zero(bits);
  }
  core_->stats.grammar_mask.add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  return only;
}

bool Engine::fill_forced(Active& a) {
  if (!a.constrained() || !options_.token_fill || a.req.logprobs >= 0 || core_->runner.state_floats() > 0) return true;
  const grammar::Vocabulary& v = a.req.grammar->vocab();
  bool first = true;
  while (a.n_generated < a.req.max_tokens && !a.matcher->is_complete()) {
    const int32_t id = only_allowed_token(a);
    if (id < 0 || v.is_stop(id)) break;
    if (!a.sampler.params().greedy()) a.sampler.next_draw();  // the draw sample() would have taken
    STRATA_CHECK(a.matcher->accept_token(id), "the grammar accepts the one token its mask allows");
    a.seq.tokens.push_back(id);
    ++a.fill_tokens;
    ++core_->stats.fill_tokens;
    if (first) {
      ++a.fill_spans;
      ++core_->stats.fill_spans;
      first = false;
    }
    if (!emit_token(a, id, nullptr)) return false;  // finished: `a` is gone
  }
  return true;
}

}  // namespace strata
