// CPU kernels over codec-encoded KV pools (row formats in backend/reference/kv_codec.h):
// writing rows into blocks, converting blocks between codecs, and paged attention that reads
// each codec directly, a block's rows of one KV head at a time dequantized into a small
// per-thread tile (never a dequantized copy of the sequence). Plain f32 pools (codec auto)
// keep using cpu::paged_attention.
//
// Determinism: like cpu::paged_attention, a query's keys are cut into fixed segments counted
// from its first visible key and folded in order, so its output does not depend on the thread
// count or on how its sequence was split into calls.
#pragma once

#include <cstdint>

#include "backend/reference/kv_codec.h"
#include "core/thread_pool.h"

namespace strata::cpu {

struct KvCodecAttentionArgs {
  const float* q;              // [n_q, n_heads, k_fmt.dim]
  float* out;                  // [n_q, n_heads, v_fmt.dim]
  const uint8_t* k_pool;       // [n_blocks_pool, block_size, n_kv_heads] rows of k_fmt.bytes()
  const uint8_t* v_pool;       // [n_blocks_pool, block_size, n_kv_heads] rows of v_fmt.bytes()
  KvRowFormat k_fmt;
  KvRowFormat v_fmt;
  int32_t seed_layer;          // turbo3 values: rows of KV head h use kv_rotation_seed(seed_layer, h)
  const int32_t* block_table;  // [ceil((pos0 + n_q) / block_size)] block ids into the pools
  int32_t block_size;          // tokens per block
  int32_t n_q;                 // query tokens; query t sits at position pos0 + t
  int32_t pos0;
  int32_t n_heads;
  int32_t n_kv_heads;          // n_heads % n_kv_heads == 0 (GQA)
  float scale;                 // multiplies q.k
  float softcap;               // 0: none; else logits = softcap * tanh(logits / softcap)
  int32_t window;              // 0: full causal; else keys p with pos0 + t - p < window
  // Delayed quantization: a sequence's first n_prefix_blocks logical blocks (block_table
  // entries [0, n_prefix_blocks)) are ids into these pools, encoded in these formats (same head
  // dims); later entries are ids into k_pool / v_pool. The format is chosen per key row, so a
  // sequence can be read with its older blocks in a codec and its newer blocks exact. When
  // either value format is turbo3, the other pool's values are rotated on decode so all values
  // are summed in the rotated domain. 0: every block is in k_pool / v_pool.
  const uint8_t* k_pool_prefix = nullptr;  // [n_blocks_prefix_pool, block_size, n_kv_heads] rows of k_fmt_prefix
  const uint8_t* v_pool_prefix = nullptr;  // [n_blocks_prefix_pool, block_size, n_kv_heads] rows of v_fmt_prefix
  KvRowFormat k_fmt_prefix;
  KvRowFormat v_fmt_prefix;
  int32_t n_prefix_blocks = 0;
};

// Attention of every query over the codec pools (same visibility as cpu::paged_attention).
void paged_attention_codec(ThreadPool& pool, const KvCodecAttentionArgs& a);

// Encodes x [n_rows, n_kv_heads, fmt.dim] into pool rows: token r goes to slot slots[r]
// (block * block_size + offset), head h to row slots[r] * n_kv_heads + h.
void kv_write_rows(ThreadPool& pool, const KvRowFormat& fmt, int32_t seed_layer, int32_t n_kv_heads, const float* x,
                   const int64_t* slots /*[n_rows]*/, int64_t n_rows, uint8_t* pool_rows);

// Re-encodes `n_rows` rows of one block from format `from` (rotation seeds of layer
// from_layer) into format `to` (seeds of to_layer); rows are [n_rows] = block_size * n_kv_heads
// in slot-major order, row i belonging to KV head i % n_kv_heads. src and dst must not overlap.
void kv_convert_rows(const KvRowFormat& from, int32_t from_layer, const uint8_t* src, const KvRowFormat& to,
                     int32_t to_layer, uint8_t* dst, int64_t n_rows, int32_t n_kv_heads);

}  // namespace strata::cpu
