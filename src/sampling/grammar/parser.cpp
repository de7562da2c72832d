#include "sampling/grammar/parser.h"

namespace strata::grammar {

int32_t Parser::intern(uint32_t node, int32_t parent) {
  const uint64_t key = (uint64_t{node} << 32) | static_cast<uint32_t>(parent);
  if (table_used_ * 2 >= table_.size()) {
    table_.assign(table_.size() * 2, Slot{0, 0, 0});
    table_epoch_ = 1;
    table_used_ = 0;
    // Entries of this step are lost: harmless, interning only removes duplicate work.
  }
  const size_t mask = table_.size() - 1;
  size_t h = (key * 0x9E3779B97F4A7C15ull) >> 40;
  for (;; ++h) {
    Slot& s = table_[h & mask];
    if (s.epoch != table_epoch_) {
      s = Slot{key, static_cast<int32_t>(frames_.size()), table_epoch_};
      ++table_used_;
      frames_.push_back(Frame{node, parent});
      return s.id;
    }
    if (s.key == key) return s.id;
  }
}

void Parser::close(ParseState& out) {
  out.tops.clear();
  out.accepting = false;
  out.popped = false;
  if (++epoch_ == 0) {
    seen_.assign(seen_.size(), 0);
    epoch_ = 1;
  }
  while (!work_.empty()) {
    const int32_t f = work_.back();
    work_.pop_back();
    if (seen_.size() < frames_.size()) seen_.resize(frames_.size() * 2 + 64, 0);
    if (seen_[f] == epoch_) continue;
    seen_[f] = epoch_;
    const Frame fr = frames_[f];
    const Node& n = g_->node(fr.node);
    if (n.has_bytes) out.tops.push_back(f);
    for (const Edge* e = g_->edges_begin(fr.node); e != g_->edges_end(fr.node); ++e) {
      if (e->call < 0) continue;
      const int32_t ret = e->tail ? fr.parent : intern(e->target, fr.parent);
      work_.push_back(intern(g_->start(e->call), ret));
    }
    if (n.final) {
      if (fr.parent == kBottom) {
        out.accepting = true;
      } else if (fr.parent == kSentinel) {
        out.popped = true;
      } else {
        work_.push_back(fr.parent);
      }
    }
  }
  // A new step's interning starts empty.
  if (++table_epoch_ == 0) {
    table_.assign(table_.size(), Slot{0, 0, 0});
    table_epoch_ = 1;
  }
  table_used_ = 0;
}

void Parser::initial(ParseState& out) {
  work_.clear();
  work_.push_back(intern(g_->start(g_->root()), kBottom));
  close(out);
}

void Parser::local_start(uint32_t n, ParseState& out) {
  out.tops.assign(1, intern(n, kSentinel));
  out.accepting = out.popped = false;
  if (++table_epoch_ == 0) table_epoch_ = 1;
  table_used_ = 0;
}

void Parser::step(const ParseState& in, uint8_t byte, ParseState& out) {
  work_.clear();
  for (int32_t f : in.tops) {
    const Frame fr = frames_[f];
    for (const Edge* e = g_->edges_begin(fr.node); e != g_->edges_end(fr.node); ++e)
      if (e->call < 0 && g_->set(e->set).has(byte)) work_.push_back(intern(e->target, fr.parent));
  }
  close(out);
}

ByteSet Parser::next_bytes(const ParseState& s) const {
  ByteSet u;
  for (int32_t f : s.tops) {
    const ByteSet& b = g_->first_bytes(frames_[f].node);
    for (int k = 0; k < 4; ++k) u.w[k] |= b.w[k];
  }
  return u;
}

}  // namespace strata::grammar
