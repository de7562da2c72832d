#include "sampling/grammar/matcher.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace strata::grammar {

namespace {

enum : uint8_t { kReject = 0, kAccept = 1, kUncertain = 2 };

// Runs the tokens at sorted positions pos_at(0..n) (ascending) from `init`, sharing the parse of
// common prefixes, and reports each one's fate. local: a cache walk (returns into the sentinel
// make a token context-dependent, or accepted when they happen at its last byte).
template <class PosAt, class Emit>
void walk_tokens(Parser& parser, const Grammar& g, const Vocabulary& vocab, const ParseState& init, int32_t simple_start,
                 size_t n, PosAt pos_at, Emit emit, std::vector<ParseState>& states, std::vector<size_t>& marks,
                 std::vector<uint8_t>& popped_prefix, std::vector<uint8_t>& popped_here, std::vector<int32_t>& simple) {
  if (n == 0) return;
  const size_t max_len = vocab.max_token_bytes();
  if (states.size() < max_len + 2) states.resize(max_len + 2);
  marks.assign(max_len + 2, 0);
  popped_prefix.assign(max_len + 2, 0);
  popped_here.assign(max_len + 2, 0);
  // simple[d] >= 0: the state at depth d is one frame at that NFA state over the sentinel, kept
  // without a frame and stepped through the state's byte table.
  simple.assign(max_len + 2, -1);
  simple[0] = simple_start;
  states[0] = init;
  marks[0] = parser.mark();
  const auto& lcp = vocab.lcp();
  std::string_view prev;
  bool has_prev = false;
  int32_t prev_pos = -2;
  size_t depth = 0;    // states[0..depth] are valid along prev's bytes
  bool died = false;   // reading prev[depth] emptied the state
  auto dead_code = [&](size_t len) -> uint8_t {
    if (len == depth + 1 && popped_here[depth + 1]) return kAccept;
    return popped_prefix[len > depth + 1 ? depth + 1 : depth] ? kUncertain : kReject;
  };
  for (size_t i = 0; i < n; ++i) {
    const int32_t sp = pos_at(i);
    const std::string_view t = vocab.sorted_token(sp);
    size_t l = 0;
    if (has_prev) {
      if (sp == prev_pos + 1) {
        l = lcp[sp];
      } else {
        const size_t cap = std::min({prev.size(), t.size(), depth + 1});
        while (l < cap && prev[l] == t[l]) ++l;
      }
    }
    prev = t;
    has_prev = true;
    prev_pos = sp;
    if (died && l > depth) {
      emit(sp, dead_code(t.size()));
      continue;
    }
    depth = std::min(l, depth);
    parser.truncate(marks[depth]);
    died = false;
    while (depth < t.size()) {
      const auto byte = static_cast<uint8_t>(t[depth]);
      bool alive;
      if (simple[depth] >= 0) {
        const int32_t to = g.byte_table(static_cast<uint32_t>(simple[depth]))[byte];
        if (to >= 0 && g.plain(static_cast<uint32_t>(to))) {
          const Node& nd = g.node(static_cast<uint32_t>(to));
          simple[depth + 1] = nd.has_bytes && g.byte_table(static_cast<uint32_t>(to)) ? to : -1;
          popped_here[depth + 1] = nd.final;
          alive = nd.has_bytes || nd.final;
          if (simple[depth + 1] < 0) {  // no table there: continue with a frame (or none)
            ParseState& next = states[depth + 1];
            if (nd.has_bytes) {
              parser.local_start(static_cast<uint32_t>(to), next);
            } else {
              next.tops.clear();
              next.accepting = false;
            }
            next.popped = nd.final;
          }
        } else if (to < 0) {
          popped_here[depth + 1] = 0;
          alive = false;
        } else {
          parser.local_start(static_cast<uint32_t>(simple[depth]), states[depth]);
          parser.step(states[depth], byte, states[depth + 1]);
          simple[depth + 1] = -1;
          popped_here[depth + 1] = states[depth + 1].popped;
          alive = states[depth + 1].alive();
        }
      } else {
        ParseState& next = states[depth + 1];
        parser.step(states[depth], byte, next);
        simple[depth + 1] = -1;
        popped_here[depth + 1] = next.popped;
        alive = next.alive();
      }
      popped_prefix[depth + 1] = popped_prefix[depth] | popped_here[depth + 1];
      if (!alive) {
        died = true;
        break;
      }
      ++depth;
      marks[depth] = parser.mark();
    }
    emit(sp, died ? dead_code(t.size()) : static_cast<uint8_t>(kAccept));
  }
  parser.truncate(marks[0]);
}

}  // namespace

TokenMaskCache::TokenMaskCache(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), masks_(grammar_->n_nodes()) {}

std::unique_ptr<TokenMaskCache::NodeMask> TokenMaskCache::compute(uint32_t node) const {
  auto m = std::make_unique<NodeMask>();
  m->accept.assign(vocab_->mask_words(), 0);
  Parser parser(grammar_.get());
  ParseState init;
  parser.local_start(node, init);
  std::vector<ParseState> states;
  std::vector<size_t> marks;
  std::vector<uint8_t> popped, popped_here;
  std::vector<int32_t> simple;
  const int32_t simple_start = grammar_->byte_table(node) ? static_cast<int32_t>(node) : -1;
  const ByteSet first = grammar_->first_bytes(node);
  const auto& sorted = vocab_->sorted();
  for (int b = 0; b < 256; ++b) {
    if (!first.has(static_cast<uint8_t>(b))) continue;
    const int32_t lo = vocab_->first_begin(b), hi = vocab_->first_begin(b + 1);
    walk_tokens(
        parser, *grammar_, *vocab_, init, simple_start, static_cast<size_t>(hi - lo), [lo](size_t i) { return lo + static_cast<int32_t>(i); },
        [&](int32_t sp, uint8_t code) {
          if (code == kAccept) {
            const int32_t id = sorted[sp];
            m->accept[id >> 5] |= 1u << (id & 31);
            ++m->n_accept;
          } else if (code == kUncertain) {
            m->uncertain.push_back(sp);
          }
        },
        states, marks, popped, popped_here, simple);
  }
  if (m->n_accept < vocab_->mask_words() / 8) {  // the id list is under an eighth of the bitmask
    for (int32_t w = 0; w < vocab_->mask_words(); ++w)
      for (uint32_t bits = m->accept[w]; bits; bits &= bits - 1) m->accept_ids.push_back(w * 32 + std::countr_zero(bits));
    m->accept.clear();
    m->accept.shrink_to_fit();
  }
  m->uncertain.shrink_to_fit();
  return m;
}

const TokenMaskCache::NodeMask& TokenMaskCache::node_mask(uint32_t node) const {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (masks_[node]) return *masks_[node];
  }
  auto m = compute(node);  // outside the lock: other states' masks stay available
  std::lock_guard<std::mutex> lock(mu_);
  if (!masks_[node]) masks_[node] = std::move(m);
  return *masks_[node];
}

void TokenMaskCache::precompute_all() const {
  for (int n = 0; n < grammar_->n_nodes(); ++n)
    if (grammar_->node(n).has_bytes) node_mask(static_cast<uint32_t>(n));
}

int TokenMaskCache::n_cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(std::count_if(masks_.begin(), masks_.end(), [](const auto& m) { return m != nullptr; }));
}

size_t TokenMaskCache::memory_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = masks_.capacity() * sizeof(masks_[0]);
  for (const auto& m : masks_)
    if (m) n += sizeof(NodeMask) + 4 * (m->accept.capacity() + m->accept_ids.capacity() + m->uncertain.capacity());
  return n;
}

Matcher::Matcher(std::shared_ptr<const TokenMaskCache> masks, int max_rollback)
    : masks_(std::move(masks)), parser_(&masks_->grammar()), max_rollback_(std::max(0, max_rollback)) {
  parser_.initial(state_);
}

void Matcher::reset() {
  parser_.truncate(0);
  history_.clear();
  terminated_ = false;
  parser_.initial(state_);
}

bool Matcher::advance(std::string_view bytes, ParseState& out) {
  ParseState cur = state_, next;
  for (char c : bytes) {
    parser_.step(cur, static_cast<uint8_t>(c), next);
    if (!next.alive()) return false;
    std::swap(cur, next);
  }
  out = std::move(cur);
  return true;
}

void Matcher::push_history() {
  history_.push_back(Snapshot{state_, parser_.mark(), terminated_});
  while (static_cast<int>(history_.size()) > max_rollback_) history_.pop_front();
}

bool Matcher::accept_bytes(std::string_view bytes) {
  if (terminated_) return false;
  const size_t mark = parser_.mark();
  ParseState out;
  if (!advance(bytes, out)) {
    parser_.truncate(mark);
    return false;
  }
  // The snapshot must point below the frames this token created.
  history_.push_back(Snapshot{state_, mark, terminated_});
  while (static_cast<int>(history_.size()) > max_rollback_) history_.pop_front();
  state_ = std::move(out);
  return true;
}

bool Matcher::accept_token(int32_t id) {
  const Vocabulary& v = masks_->vocab();
  if (id < 0 || id >= v.size() || terminated_) return false;
  if (v.is_stop(id)) {
    if (!state_.accepting) return false;
    push_history();
    terminated_ = true;
    return true;
  }
  if (v.is_special(id) || v.token(id).empty()) return false;
  return accept_bytes(v.token(id));
}

bool Matcher::can_accept_bytes(std::string_view bytes) {
  if (terminated_) return false;
  const size_t mark = parser_.mark();
  ParseState out;
  const bool ok = advance(bytes, out);
  parser_.truncate(mark);
  return ok;
}

bool Matcher::rollback(int n_tokens) {
  if (n_tokens < 0 || n_tokens > static_cast<int>(history_.size())) return false;
  for (int i = 0; i < n_tokens; ++i) {
    Snapshot& s = history_.back();
    state_ = std::move(s.state);
    terminated_ = s.terminated;
    parser_.truncate(s.mark);
    history_.pop_back();
  }
  return true;
}

void Matcher::fill_next_token_bitmask(uint32_t* words) {
  const Vocabulary& v = masks_->vocab();
  const size_t nw = static_cast<size_t>(v.mask_words());
  auto set_stops = [&] {
    for (int32_t id : v.stop_ids()) words[id >> 5] |= 1u << (id & 31);
  };
  std::memset(words, 0, nw * sizeof(uint32_t));
  if (terminated_) {
    set_stops();
    return;
  }
  // Distinct NFA states among the tops (several stacks can rest on one state).
  std::vector<uint32_t> nodes;
  nodes.reserve(state_.tops.size());
  for (int32_t f : state_.tops) nodes.push_back(parser_.frame(f).node);
  std::sort(nodes.begin(), nodes.end());
  nodes.erase(std::unique(nodes.begin(), nodes.end()), nodes.end());
  cand_.clear();
  bool zero = true;  // words still all zero
  for (size_t k = 0; k < nodes.size(); ++k) {
    const auto& m = masks_->node_mask(nodes[k]);
    if (!m.accept.empty()) {
      if (zero) {
        std::memcpy(words, m.accept.data(), nw * sizeof(uint32_t));
      } else {
        for (size_t i = 0; i < nw; ++i) words[i] |= m.accept[i];
      }
      zero = false;
    } else {
      for (int32_t id : m.accept_ids) words[id >> 5] |= 1u << (id & 31);
      if (!m.accept_ids.empty()) zero = false;
    }
    cand_.insert(cand_.end(), m.uncertain.begin(), m.uncertain.end());
  }
  if (nodes.size() > 1) {
    std::sort(cand_.begin(), cand_.end());
    cand_.erase(std::unique(cand_.begin(), cand_.end()), cand_.end());
  }
  const auto& sorted = v.sorted();
  std::erase_if(cand_, [&](int32_t sp) { const int32_t id = sorted[sp]; return (words[id >> 5] >> (id & 31)) & 1; });
  static thread_local std::vector<size_t> marks;
  static thread_local std::vector<uint8_t> popped, popped_here;
  static thread_local std::vector<int32_t> simple;
  walk_tokens(
      parser_, masks_->grammar(), v, state_, -1, cand_.size(), [&](size_t i) { return cand_[i]; },
      [&](int32_t sp, uint8_t code) {
        if (code == kAccept) {
          const int32_t id = sorted[sp];
          words[id >> 5] |= 1u << (id & 31);
        }
      },
      walk_, marks, popped, popped_here, simple);
  if (state_.accepting) set_stops();
}

std::string Matcher::forced_bytes(size_t max_bytes) {
  std::string out;
  if (terminated_) return out;
  const size_t mark = parser_.mark();
  ParseState cur = state_, next;
  while (out.size() < max_bytes && !cur.accepting) {
    const ByteSet b = parser_.next_bytes(cur);
    if (b.count() != 1) break;
    int byte = 0;
    while (!b.has(static_cast<uint8_t>(byte))) ++byte;
    parser_.step(cur, static_cast<uint8_t>(byte), next);
    if (!next.alive()) break;
    out += static_cast<char>(byte);
    std::swap(cur, next);
  }
  parser_.truncate(mark);
  return out;
}

std::vector<int32_t> Matcher::forced_tokens(size_t max_bytes) {
  const std::string bytes = forced_bytes(max_bytes);
  const Vocabulary& v = masks_->vocab();
  const auto& sorted = v.sorted();
  std::vector<int32_t> out;
  size_t pos = 0;
  while (pos < bytes.size()) {
    int32_t best = -1;
    size_t best_len = 0;
    for (size_t len = std::min(v.max_token_bytes(), bytes.size() - pos); len > 0 && best < 0; --len) {
      const std::string_view want(bytes.data() + pos, len);
      auto it = std::lower_bound(sorted.begin(), sorted.end(), want,
                                 [&](int32_t id, std::string_view w) { return std::string_view(v.token(id)) < w; });
      if (it != sorted.end() && v.token(*it) == want) {
        best = *it;
        best_len = len;
      }
    }
    if (best < 0) break;
    out.push_back(best);
    pos += best_len;
  }
  return out;
}

}  // namespace strata::grammar
