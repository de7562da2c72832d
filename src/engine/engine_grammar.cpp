// Constrained decoding in the engine: a request's grammar (GenerationRequest::grammar) becomes
// a per-sequence Matcher at admission; every sampled row of the request draws under the
// matcher's token mask (Sampler's TokenMask: after bias and penalties, before temperature and
// the filters) and the matcher advances by the committed token. A verify span draws each row
// under the mask of the matcher advanced through the tokens accepted before it, so the matcher
// only ever advances by committed tokens and a rejected draft needs no rollback. A checkpoint
// stores the generated ids; resuming replays them through a fresh matcher, which gives the
// state the uninterrupted run had (the matcher is a function of the tokens it accepted).
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
  a.mask.assign(size_t(a.req.grammar->vocab().mask_words()), 0u);
  ++core_->stats.grammar_requests;
}

bool Engine::replay_grammar(Active& a, const std::vector<int32_t>& generated) {
  if (!a.matcher) return true;
  for (int32_t id : generated) {
    if (!a.matcher->accept_token(id)) {
      a.matcher->reset();
      return false;
    }
  }
  if (a.matcher->is_complete()) {  // a complete output would have finished, not checkpointed
    a.matcher->reset();
    return false;
  }
  return true;
}

int32_t Engine::sample_token(Active& a, const float* logits, int32_t vocab) {
  if (!a.matcher) return a.sampler.sample(logits, vocab);
  const auto t0 = Clock::now();
  a.matcher->fill_next_token_bitmask(a.mask.data());
  const int32_t n_ids = a.req.grammar->vocab().size();
  // The row can be sampled only if the mask keeps an id the sampler may draw.
  const int32_t limit = std::min(n_ids, a.sampler.effective_vocab(vocab));
  bool any = false;
  for (int32_t w = 0; w * 32 < limit && !any; ++w) {
    uint32_t bits = a.mask[size_t(w)];
    if ((w + 1) * 32 > limit) bits &= (limit - w * 32 >= 32) ? ~0u : ((1u << (limit - w * 32)) - 1u);
    any = bits != 0;
  }
  core_->stats.grammar_mask.add(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  if (!any) return -1;
  const TokenMask mask{a.mask.data(), n_ids};
  const int32_t token = a.sampler.sample(logits, vocab, &mask);
  STRATA_CHECK(a.matcher->accept_token(token), "the grammar accepts the token its mask allowed (" + std::to_string(token) + ")");
  return token;
}

}  // namespace strata
