#include "model/layers/attention.h"

#include "model/lora.h"

#include <cstring>

#include "backend/cpu/cpu_ops.h"
#include "backend/cpu/kv_codec.h"
#include "core/check.h"

namespace strata {

void batch_positions(const StepBatch& batch, std::vector<int32_t>* positions) {
  positions->resize(size_t(batch.n_tokens()));
  int64_t t = 0;
  for (const auto& s : batch.seqs) {
    for (int32_t i = 0; i < s.n_tokens; ++i) (*positions)[size_t(t++)] = s.pos0 + i;
  }
  STRATA_CHECK(t == batch.n_tokens(), "spans do not cover the batch's tokens");
}

void apply_rope(ThreadPool& pool, RopeProvider& rope, const StepBatch& batch, const int32_t* positions, float* x,
                int32_t n_heads, int32_t head_dim) {
  int64_t t0 = 0;
  for (const auto& s : batch.seqs) {
    const RopeTable& tab = rope.table(int64_t(s.pos0) + s.n_tokens);
    cpu::rope(pool, x + t0 * n_heads * head_dim, s.n_tokens, n_heads, head_dim, tab.rot_dim, positions + t0,
              tab.inv_freq.data(), tab.attn_factor);
    t0 += s.n_tokens;
  }
}

namespace {

// The block table `layer` reads: sliding-window layers page apart when the span carries theirs.
const std::vector<int32_t>& layer_table(const SeqSpan& s, const KvStorage& kv, int layer) {
  return kv.window_paged(layer) && !s.window_block_table.empty() ? s.window_block_table : s.block_table;
}

// Leading entries of the table `layer` reads that are ids into kv.quant()'s pools.
int32_t quant_blocks(const SeqSpan& s, const KvStorage& kv, int layer) {
  return &layer_table(s, kv, layer) == &s.block_table ? s.n_quant_blocks : 0;
}

bool f32_rows(const KvStorage& kv, int layer) {
  return kv.k_format(layer).kind == KvRowKind::kF32 && kv.v_format(layer).kind == KvRowKind::kF32;
}

// write_kv for layers stored in a codec: rows encoded straight into their slots.
void write_kv_codec(ThreadPool& pool, const StepBatch& batch, KvStorage& kv, int layer, const float* k,
                    const float* v) {
  const int32_t bs = kv.block_size();
  thread_local std::vector<int64_t> slots;
  slots.clear();
  for (const auto& s : batch.seqs) {
    const std::vector<int32_t>& table = layer_table(s, kv, layer);
    for (int32_t i = 0; i < s.n_tokens; ++i) {
      const int32_t pos = s.pos0 + i;
      const size_t bi = size_t(pos / bs);
      STRATA_CHECK(bi < table.size(), "block table does not cover the span's positions");
      STRATA_CHECK(int32_t(bi) >= quant_blocks(s, kv, layer), "write_kv into a converted block");
      const int32_t block = table[bi];
      STRATA_CHECK(block >= 0 && block < kv.n_blocks(layer), "block id outside the KV pool");
      slots.push_back(int64_t(block) * bs + pos % bs);
    }
  }
  const int32_t n_kv = kv.spec(kv.owner(layer)).n_kv_heads;
  const int64_t n = int64_t(slots.size());
  cpu::kv_write_rows(pool, kv.k_format(layer), kv.owner(layer), n_kv, k, slots.data(), n, kv.k_rows(layer));
  cpu::kv_write_rows(pool, kv.v_format(layer), kv.owner(layer), n_kv, v, slots.data(), n, kv.v_rows(layer));
}

}  // namespace

void write_kv(ThreadPool& pool, const StepBatch& batch, KvStorage& kv, int layer, const float* k, const float* v) {
  if (!f32_rows(kv, layer)) {
    write_kv_codec(pool, batch, kv, layer, k, v);
    return;
  }
  write_kv(batch, kv, layer, k, v);
}

void write_kv(const StepBatch& batch, KvStorage& kv, int layer, const float* k, const float* v) {
  STRATA_CHECK(f32_rows(kv, layer), "write_kv without a thread pool on a codec layer");
  const KvLayerSpec& spec = kv.spec(layer);
  const int64_t k_row = int64_t(spec.n_kv_heads) * spec.head_dim_k;
  const int64_t v_row = int64_t(spec.n_kv_heads) * spec.head_dim_v;
  const int32_t bs = kv.block_size();
  float* kp = kv.k_pool(layer);
  float* vp = kv.v_pool(layer);
  int64_t t = 0;
  for (const auto& s : batch.seqs) {
    for (int32_t i = 0; i < s.n_tokens; ++i, ++t) {
      const int32_t pos = s.pos0 + i;
      const size_t bi = size_t(pos / bs);
      const std::vector<int32_t>& table = layer_table(s, kv, layer);
      STRATA_CHECK(bi < table.size(), "block table does not cover the span's positions");
      STRATA_CHECK(int32_t(bi) >= quant_blocks(s, kv, layer), "write_kv into a converted block");
      const int32_t block = table[bi];
      STRATA_CHECK(block >= 0 && block < kv.n_blocks(layer), "block id outside the KV pool");
      const int64_t slot = int64_t(block) * bs + pos % bs;
      std::memcpy(kp + slot * k_row, k + t * k_row, size_t(k_row) * sizeof(float));
      std::memcpy(vp + slot * v_row, v + t * v_row, size_t(v_row) * sizeof(float));
    }
  }
}

namespace {

// attend for one span of a layer stored in a codec: the kernel reads the encoded blocks.
void attend_codec(ThreadPool& pool, const SeqSpan& s, KvStorage& kv, int layer, const AttentionParams& p,
                  const float* q, float* out) {
  cpu::KvCodecAttentionArgs a;
  a.q = q;
  a.out = out;
  a.k_pool = kv.k_rows(layer);
  a.v_pool = kv.v_rows(layer);
  a.k_fmt = kv.k_format(layer);
  a.v_fmt = kv.v_format(layer);
  STRATA_CHECK(a.k_fmt.dim == p.head_dim && a.v_fmt.dim == p.head_dim_v, "attention head dims differ from the KV pool's");
  a.seed_layer = kv.owner(layer);
  const std::vector<int32_t>& table = layer_table(s, kv, layer);
  STRATA_CHECK(int64_t(table.size()) * kv.block_size() >= int64_t(s.pos0) + s.n_tokens,
               "block table does not cover the span's positions");
  a.block_table = table.data();
  a.block_size = kv.block_size();
  a.n_q = s.n_tokens;
  a.pos0 = s.pos0;
  a.n_heads = p.n_heads;
  a.n_kv_heads = p.n_kv_heads;
  a.scale = p.scale;
  a.softcap = p.softcap;
  a.window = p.window;
  a.n_prefix_blocks = quant_blocks(s, kv, layer);
  if (a.n_prefix_blocks > 0) {
    // Older blocks converted to the quant storage's codec, newer ones here: read per block.
    STRATA_CHECK(kv.quant() != nullptr, "a span has converted blocks but the KV storage has no quant storage");
    KvStorage& qkv = *kv.quant();
    a.k_pool_prefix = qkv.k_rows(layer);
    a.v_pool_prefix = qkv.v_rows(layer);
    a.k_fmt_prefix = qkv.k_format(layer);
    a.v_fmt_prefix = qkv.v_format(layer);
  }
  cpu::paged_attention_codec(pool, a);
}

}  // namespace

void attend(ThreadPool& pool, const StepBatch& batch, KvStorage& kv, int layer, const AttentionParams& p, const float* q,
            float* out) {
  const bool codec = !f32_rows(kv, layer);
  int64_t t0 = 0;
  for (const auto& s : batch.seqs) {
    if (s.n_tokens == 0) continue;
    if (codec || quant_blocks(s, kv, layer) > 0) {
      attend_codec(pool, s, kv, layer, p, q + t0 * p.n_heads * p.head_dim, out + t0 * p.n_heads * p.head_dim_v);
      t0 += s.n_tokens;
      continue;
    }
    cpu::PagedAttentionArgs a;
    a.q = q + t0 * p.n_heads * p.head_dim;
    a.out = out + t0 * p.n_heads * p.head_dim_v;
    a.k_pool = kv.k_pool(layer);
    a.v_pool = kv.v_pool(layer);
    const std::vector<int32_t>& table = layer_table(s, kv, layer);
    STRATA_CHECK(int64_t(table.size()) * kv.block_size() >= int64_t(s.pos0) + s.n_tokens,
                 "block table does not cover the span's positions");
    a.block_table = table.data();
    a.block_size = kv.block_size();
    a.n_q = s.n_tokens;
    a.pos0 = s.pos0;
    a.n_heads = p.n_heads;
    a.n_kv_heads = p.n_kv_heads;
    a.head_dim = p.head_dim;
    a.head_dim_v = p.head_dim_v;
    a.scale = p.scale;
    a.softcap = p.softcap;
    a.window = p.window;
    cpu::paged_attention(pool, a);
    t0 += s.n_tokens;
  }
}

void attention_forward(ThreadPool& pool, const AttentionWeights& w, const AttentionParams& p, const StepBatch& batch,
                       const int32_t* positions, const float* x, KvStorage& kv, int layer, AttentionScratch& s,
                       float* out, const LinearLora* lora) {
  const int64_t n = batch.n_tokens();
  s.q.resize(size_t(n * p.n_heads * p.head_dim));
  s.k.resize(size_t(n * p.n_kv_heads * p.head_dim));
  s.v.resize(size_t(n * p.n_kv_heads * p.head_dim_v));
  s.attn.resize(size_t(n * p.n_heads * p.head_dim_v));
  auto bias = [](const std::vector<float>& b) { return b.empty() ? nullptr : b.data(); };
  cpu::matmul(pool, x, n, w.q, bias(w.q_bias), s.q.data());
  cpu::matmul(pool, x, n, w.k, bias(w.k_bias), s.k.data());
  cpu::matmul(pool, x, n, w.v, bias(w.v_bias), s.v.data());
  if (lora != nullptr) {
    lora->apply(WeightRole::kQ, x, w.q.cols, s.q.data(), w.q.rows);
    lora->apply(WeightRole::kK, x, w.k.cols, s.k.data(), w.k.rows);
    lora->apply(WeightRole::kV, x, w.v.cols, s.v.data(), w.v.rows);
  }
  if (!w.q_norm.empty()) {
    cpu::rms_norm(pool, s.q.data(), w.q_norm.data(), s.q.data(), n * p.n_heads, p.head_dim, p.norm_eps, p.norm_one_plus_w);
  }
  if (!w.k_norm.empty()) {
    cpu::rms_norm(pool, s.k.data(), w.k_norm.data(), s.k.data(), n * p.n_kv_heads, p.head_dim, p.norm_eps,
                  p.norm_one_plus_w);
  }
  if (p.rope != nullptr) {
    apply_rope(pool, *p.rope, batch, positions, s.q.data(), p.n_heads, p.head_dim);
    apply_rope(pool, *p.rope, batch, positions, s.k.data(), p.n_kv_heads, p.head_dim);
  }
  write_kv(pool, batch, kv, layer, s.k.data(), s.v.data());
  attend(pool, batch, kv, layer, p, s.q.data(), s.attn.data());
  cpu::matmul(pool, s.attn.data(), n, w.o, bias(w.o_bias), out);
  if (lora != nullptr) lora->apply(WeightRole::kO, s.attn.data(), w.o.cols, out, w.o.rows);
}

}  // namespace strata
