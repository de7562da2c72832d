#include "kv/kv_plan.h"

#include <algorithm>

namespace strata {

namespace {

constexpr int64_t kMaxBlocks = int64_t(1) << 30;

Error bad(const std::string& m) { return make_error(ErrorCode::kInvalidArgument, m); }

int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

Status check_options(const KvLimits& o, int32_t quant_start) {
  if (o.block_size < 1 || o.block_size > 1024) return bad("block_size must be in [1, 1024], got " + std::to_string(o.block_size));
  if (o.max_batch_tokens < 1) return bad("max_batch_tokens must be >= 1, got " + std::to_string(o.max_batch_tokens));
  if (o.max_num_seqs < 1) return bad("max_num_seqs must be >= 1, got " + std::to_string(o.max_num_seqs));
  if (o.kv_window_blocks < 0) return bad("kv_window_blocks must be >= 0, got " + std::to_string(o.kv_window_blocks));
  if (quant_start < 0) return bad("--kv-quant-start must be >= 0, got " + std::to_string(quant_start));
  if (o.kv_quant_blocks < 0) return bad("kv_quant_blocks must be >= 0, got " + std::to_string(o.kv_quant_blocks));
  return Status();
}

// The sliding-window pool's floor (one query's window behind it plus a block) and what every
// running sequence's window and one step's tokens need.
struct WindowNeed {
  bool windows = false;
  int64_t min = 0, need = 0;
};

WindowNeed window_need(const KvPoolShape& shape, const KvLimits& o) {
  WindowNeed w;
  w.windows = shape.window > 0 && shape.window_bytes_per_token > 0;
  if (!w.windows) return w;
  const int64_t bs = o.block_size;
  w.min = div_up(shape.window - 1, bs) + 2;
  w.need = int64_t(o.max_num_seqs) * w.min + div_up(o.max_batch_tokens, bs);
  return w;
}

// The sliding-window pool's blocks (0: no windows): kv_window_blocks when set; beside explicit
// kv_blocks what the windows need, at least one window's floor and at most kv_blocks; from the
// bytes at most an equal share (a pool past what the windows need buys only cache), or every
// byte for a model of sliding layers only.
int64_t window_blocks(const KvPoolShape& shape, const KvLimits& o, const WindowNeed& w) {
  if (!w.windows) return 0;
  if (o.kv_window_blocks > 0) return o.kv_window_blocks;
  if (o.kv_blocks > 0) return std::max(w.min, std::min<int64_t>(w.need, o.kv_blocks));
  const int64_t token_budget = o.kv_cache_bytes / o.block_size;  // bytes per token position of a block
  return shape.full_bytes_per_token > 0
             ? std::min(w.need, token_budget / (shape.full_bytes_per_token + shape.window_bytes_per_token))
             : token_budget / shape.window_bytes_per_token;
}

Error window_too_small(const KvPoolShape& shape, int64_t n_window, int64_t window_min) {
  return bad("kv_window_blocks " + std::to_string(n_window) + " cannot hold one sliding window of " +
             std::to_string(shape.window) + " tokens; at least " + std::to_string(window_min) + " blocks are needed");
}

// Delayed quantization: the sliding-window pool as without it (windows stay exact), then the
// exact and the codec pool of the full-attention layers.
Result<KvPoolPlan> plan_quant(const KvPoolShape& shape, const KvLimits& o, int32_t quant_start) {
  const int64_t bs = o.block_size, n = quant_start;
  // One sequence holds ceil((N + 1) / bs) exact blocks when it passes N, plus the block it grows into.
  const int64_t one_seq = div_up(n + 1, bs) + 1;
  const WindowNeed w = window_need(shape, o);
  const int64_t n_window = window_blocks(shape, o, w);
  if (n_window < w.min) return window_too_small(shape, n_window, w.min);
  KvPoolPlan p;
  p.n_window_blocks = int32_t(std::min(n_window, kMaxBlocks));
  if (o.kv_blocks > 0) {
    if (o.kv_blocks < one_seq) {
      return bad("kv_blocks " + std::to_string(o.kv_blocks) + " cannot hold the " + std::to_string(n) +
                 " exact tokens of --kv-quant-start in blocks of " + std::to_string(bs) + "; at least " +
                 std::to_string(one_seq) + " are needed");
    }
    p.n_blocks = o.kv_blocks;
    p.n_quant_blocks = o.kv_quant_blocks > 0 ? o.kv_quant_blocks : o.kv_blocks;
    return p;
  }
  const int64_t exact_block = shape.full_bytes_per_token * bs, quant_block = shape.quant_bytes_per_token * bs;
  if (exact_block <= 0 || quant_block <= 0) return bad("--kv-quant-start " + std::to_string(n) + ": no layer holds full-attention KV");
  const int64_t bytes = o.kv_cache_bytes - n_window * shape.window_bytes_per_token * bs;
  const int64_t want = int64_t(o.max_num_seqs) * (div_up(n, bs) + 1) + div_up(o.max_batch_tokens, bs);
  int64_t n_exact = std::min(want, bytes / 2 / exact_block);
  n_exact = std::max(n_exact, one_seq);
  const int64_t left = bytes - n_exact * exact_block;
  const int64_t n_quant = o.kv_quant_blocks > 0 ? o.kv_quant_blocks : (left > 0 ? left / quant_block : 0);
  if (n_exact * exact_block > bytes || n_quant < 2) {
    return bad("kv_cache_bytes " + std::to_string(o.kv_cache_bytes) + " cannot hold the exact KV of --kv-quant-start " +
               std::to_string(n) + " (" + std::to_string(n_exact) + " blocks of " + std::to_string(exact_block) +
               " bytes) and 2 codec blocks of " + std::to_string(quant_block) + " bytes" +
               (n_window > 0 ? " after " + std::to_string(n_window) + " sliding-window blocks of " +
                                   std::to_string(shape.window_bytes_per_token * bs) + " bytes"
                             : std::string()));
  }
  p.n_blocks = int32_t(std::min(n_exact, kMaxBlocks));
  p.n_quant_blocks = int32_t(std::min(n_quant, kMaxBlocks));
  return p;
}

}  // namespace

Result<KvPoolPlan> plan_kv_pools(const KvPoolShape& shape, const KvLimits& o, int32_t max_len, int32_t quant_start) {
  STRATA_RETURN_IF_ERROR(check_options(o, quant_start));
  KvPoolPlan plan;
  if (quant_start > 0) {
    auto q = plan_quant(shape, o, quant_start);
    if (!q.ok()) return q.error();
    plan = *q;
    plan.n_state_slots = shape.has_state ? o.max_num_seqs : 0;
    return plan;
  }
  const int64_t bs = o.block_size;
  const int64_t full_bytes = shape.full_bytes_per_token, window_bytes = shape.window_bytes_per_token;
  // Window pool: what one query reads behind it plus a block, per sequence, and one step's tokens.
  const WindowNeed need = window_need(shape, o);
  const bool windows = need.windows;
  const int64_t window_min = need.min;
  const int64_t n_window = window_blocks(shape, o, need);
  int64_t n_full = 0;
  if (o.kv_blocks > 0) {
    n_full = o.kv_blocks;
  } else {
    const int64_t token_budget = o.kv_cache_bytes / bs;  // bytes per token position of a block
    if (full_bytes > 0) {
      n_full = (token_budget - window_bytes * n_window) / full_bytes;
    } else {
      // Only sliding layers: the full pool is bookkeeping for the prefix index, no bytes.
      n_full = int64_t(o.max_num_seqs) * div_up(std::max(max_len, 1), bs);
    }
    if (n_full < 2 || (windows && n_window < window_min && o.kv_window_blocks == 0)) {
      return bad("kv_cache_bytes " + std::to_string(o.kv_cache_bytes) + " holds " +
                 std::to_string(std::max<int64_t>(n_full, 0)) + " full-attention and " +
                 std::to_string(std::max<int64_t>(n_window, 0)) + " sliding-window KV blocks of " + std::to_string(bs) +
                 " tokens (" + std::to_string(full_bytes * bs) + " and " + std::to_string(window_bytes * bs) +
                 " bytes); at least 2 and " + std::to_string(window_min) + " are needed");
    }
  }
  if (windows && n_window < window_min) return window_too_small(shape, n_window, window_min);
  plan.n_blocks = int32_t(std::min(n_full, kMaxBlocks));
  plan.n_window_blocks = int32_t(std::min(n_window, kMaxBlocks));
  plan.n_state_slots = shape.has_state ? o.max_num_seqs : 0;
  return plan;
}

int64_t KvPoolPlan::kv_bytes(const KvPoolShape& shape, int32_t block_size) const {
  const int64_t bs = block_size;
  return (int64_t(n_blocks) * shape.full_bytes_per_token + int64_t(n_window_blocks) * shape.window_bytes_per_token +
          int64_t(n_quant_blocks) * shape.quant_bytes_per_token) *
         bs;
}

std::string KvPoolPlan::describe(const KvPoolShape& shape, int32_t block_size) const {
  const int64_t bs = block_size;
  auto mib = [](int64_t b) { return std::to_string(b >> 20) + " MiB"; };
  std::string s = std::to_string(n_blocks) + (n_quant_blocks > 0 ? " exact" : " full-attention") + " blocks of " +
                  std::to_string(bs) + " tokens (" + mib(int64_t(n_blocks) * shape.full_bytes_per_token * bs) + ")";
  if (n_window_blocks > 0) {
    s += ", " + std::to_string(n_window_blocks) + " sliding-window blocks (" +
         mib(int64_t(n_window_blocks) * shape.window_bytes_per_token * bs) + ")";
  }
  if (n_quant_blocks > 0) {
    s += ", " + std::to_string(n_quant_blocks) + " codec blocks (" +
         mib(int64_t(n_quant_blocks) * shape.quant_bytes_per_token * bs) + ")";
  }
  if (n_state_slots > 0) s += ", " + std::to_string(n_state_slots) + " recurrent-state slots";
  return s;
}

Result<int64_t> device_kv_bytes(double fraction, int64_t total, int64_t free, int64_t fixed, int64_t reserve) {
  if (!(fraction > 0.0 && fraction <= 1.0)) {
    return bad("--gpu-memory-fraction must be in (0, 1], got " + std::to_string(fraction));
  }
  const int64_t budget = int64_t(fraction * double(total)) - (total - free) - fixed - reserve;
  if (budget <= 0) {
    return make_error(ErrorCode::kResourceExhausted,
                      "--gpu-memory-fraction " + std::to_string(fraction) + " of " + std::to_string(total) +
                          " bytes leaves no room for the KV cache after the weights and scratch (" + std::to_string(fixed) +
                          " bytes; " + std::to_string(total - free) + " in use already)");
  }
  return budget;
}

}  // namespace strata
