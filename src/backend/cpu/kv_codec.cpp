// Paged attention over codec pools, row writing and block conversion (see kv_codec.h).
//
// A task takes one segment of kSegment keys of one query. Per KV head it dequantizes the
// segment's key rows into a tile [n, head_dim] and its value rows into a tile [n, head_dim_v]
// (turbo3 values stay rotated), then every query head of the group reads the tiles: logits,
// exp against the segment max, weighted value sums. Segments fold in order (online softmax);
// turbo3 outputs rotate back once at the end.
#include "backend/cpu/kv_codec.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/check.h"
#include "tensor/dtype.h"

namespace strata::cpu {

namespace {

constexpr int64_t kSegment = 64;  // keys per segment: part of the numerics
constexpr int kLanes = 16;        // accumulator lanes of dot(): part of the numerics

// Sum of a[i] * b[i]: 16 independent lane sums, then a fixed pairwise reduction.
inline float dot(const float* a, const float* b, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * b[i + l];
  for (int l = 0; i < n; ++i, ++l) acc[l] += a[i] * b[i];
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

// Decodes one row into out [f.dim]; turbo3 rows stay rotated.
inline void decode_row(const KvRowFormat& f, const uint8_t* row, float* out) {
  switch (f.kind) {
    case KvRowKind::kF32: std::memcpy(out, row, size_t(f.dim) * 4); return;
    case KvRowKind::kBf16: {
      const uint16_t* r = reinterpret_cast<const uint16_t*>(row);
      for (int32_t d = 0; d < f.dim; ++d) {
        const uint32_t u = uint32_t(r[d]) << 16;
        std::memcpy(out + d, &u, 4);
      }
      return;
    }
    case KvRowKind::kFp8: {
      // e4m3 -> f32 through a table built once.
      static const auto table = [] {
        std::vector<float> t(256);
        for (int c = 0; c < 256; ++c) t[size_t(c)] = e4m3_to_f32(uint8_t(c));
        return t;
      }();
      float scale;
      std::memcpy(&scale, row, 4);
      const uint8_t* c = row + 4;
      for (int32_t d = 0; d < f.dim; ++d) out[d] = table[c[d]] * scale;
      return;
    }
    case KvRowKind::kAffine8:
    case KvRowKind::kAffine4: {
      const bool eight = f.kind == KvRowKind::kAffine8;
      const int64_t packed = eight ? (f.dim + 3) / 4 * 4 : (f.dim + 7) / 8 * 4;
      const uint16_t* scales = reinterpret_cast<const uint16_t*>(row + packed);
      const uint16_t* biases = scales + f.n_groups();
      for (int32_t g = 0; g < f.n_groups(); ++g) {
        const float s = bf16_to_f32(scales[g]), b = bf16_to_f32(biases[g]);
        const int32_t d0 = g * f.group;
        if (eight) {
          for (int32_t i = 0; i < f.group; ++i) out[d0 + i] = float(row[d0 + i]) * s + b;
        } else {
          for (int32_t i = 0; i < f.group; i += 2) {
            const uint8_t byte = row[(d0 + i) / 2];
            out[d0 + i] = float(byte & 15) * s + b;
            out[d0 + i + 1] = float(byte >> 4) * s + b;
          }
        }
      }
      return;
    }
    case KvRowKind::kTurbo3: {
      float scale;
      std::memcpy(&scale, row, 4);
      float level[8];
      for (int c = 0; c < 8; ++c) level[c] = kLloydMax3[c] * scale;
      const uint8_t* codes = row + 4;
      // 8 codes per 3 bytes (dim is a power of two >= 8).
      for (int32_t d = 0; d < f.dim; d += 8) {
        const uint8_t* p = codes + 3 * (d / 8);
        const uint32_t w = uint32_t(p[0]) | (uint32_t(p[1]) << 8) | (uint32_t(p[2]) << 16);
        for (int i = 0; i < 8; ++i) out[d + i] = level[(w >> (3 * i)) & 7u];
      }
      return;
    }
  }
}

// Values are summed in the rotated domain when any of the sequence's value rows are turbo3.
inline bool rotated_values(const KvCodecAttentionArgs& a) {
  return a.v_fmt.kind == KvRowKind::kTurbo3 || (a.n_prefix_blocks > 0 && a.v_fmt_prefix.kind == KvRowKind::kTurbo3);
}

struct Geometry {
  int64_t group, hd, hdv, nh, nkv, k_bytes, v_bytes, k_bytes_prefix, v_bytes_prefix;
  bool rotated;
  explicit Geometry(const KvCodecAttentionArgs& a)
      : group(a.n_heads / a.n_kv_heads),
        hd(a.k_fmt.dim),
        hdv(a.v_fmt.dim),
        nh(a.n_heads),
        nkv(a.n_kv_heads),
        k_bytes(a.k_fmt.bytes()),
        v_bytes(a.v_fmt.bytes()),
        k_bytes_prefix(a.n_prefix_blocks > 0 ? a.k_fmt_prefix.bytes() : 0),
        v_bytes_prefix(a.n_prefix_blocks > 0 ? a.v_fmt_prefix.bytes() : 0),
        rotated(rotated_values(a)) {}
  int64_t part_floats() const { return nh * (hdv + 2); }
  // Scratch: key tile, value tile, logits.
  int64_t scratch_floats() const { return kSegment * (hd + hdv) + kSegment; }
};

inline int64_t first_key(const KvCodecAttentionArgs& a, int32_t t) {
  const int64_t qpos = int64_t(a.pos0) + t;
  return a.window > 0 ? std::max<int64_t>(0, qpos - a.window + 1) : 0;
}

inline int64_t n_segments(const KvCodecAttentionArgs& a, int32_t t) {
  const int64_t keys = int64_t(a.pos0) + t + 1 - first_key(a, t);
  return (keys + kSegment - 1) / kSegment;
}

// Keys [k0, k1) of query t into part [n_heads][hdv + 2] = (unnormalized sums, max, sum of exp).
void segment(const KvCodecAttentionArgs& a, const Geometry& g, int32_t t, int64_t k0, int64_t k1, float* scratch,
             float* part) {
  const int64_t n = k1 - k0;
  float* kt = scratch;                 // [n, hd]
  float* vt = kt + kSegment * g.hd;    // [n, hdv]
  float* lg = vt + kSegment * g.hdv;   // [n]
  int64_t slots[kSegment];
  bool prefix[kSegment];  // the row's block lives in the prefix pools
  for (int64_t j = 0; j < n; ++j) {
    const int64_t p = k0 + j;
    const int64_t bi = p / a.block_size;
    slots[j] = int64_t(a.block_table[bi]) * a.block_size + p % a.block_size;
    prefix[j] = bi < a.n_prefix_blocks;
  }
  const float* q_t = a.q + int64_t(t) * g.nh * g.hd;
  float signs[1024];
  for (int64_t kvh = 0; kvh < g.nkv; ++kvh) {
    bool have_signs = false;
    for (int64_t j = 0; j < n; ++j) {
      if (prefix[j]) {
        decode_row(a.k_fmt_prefix, a.k_pool_prefix + (slots[j] * g.nkv + kvh) * g.k_bytes_prefix, kt + j * g.hd);
      } else {
        decode_row(a.k_fmt, a.k_pool + (slots[j] * g.nkv + kvh) * g.k_bytes, kt + j * g.hd);
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      const KvRowFormat& vf = prefix[j] ? a.v_fmt_prefix : a.v_fmt;
      const uint8_t* vrow = prefix[j] ? a.v_pool_prefix + (slots[j] * g.nkv + kvh) * g.v_bytes_prefix
                                      : a.v_pool + (slots[j] * g.nkv + kvh) * g.v_bytes;
      decode_row(vf, vrow, vt + j * g.hdv);
      if (g.rotated && vf.kind != KvRowKind::kTurbo3) {
        // A plain row among turbo3 rows: move it into the rotated domain once.
        if (!have_signs) kv_rotation_signs(kv_rotation_seed(a.seed_layer, int32_t(kvh)), int32_t(g.hdv), signs);
        have_signs = true;
        reference::kv_rotate(vt + j * g.hdv, int32_t(g.hdv), signs);
      }
    }
    for (int64_t h = kvh * g.group; h < (kvh + 1) * g.group; ++h) {
      const float* q = q_t + h * g.hd;
      float mx = -INFINITY;
      for (int64_t j = 0; j < n; ++j) {
        float s = dot(q, kt + j * g.hd, g.hd) * a.scale;
        if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
        lg[j] = s;
        mx = std::max(mx, s);
      }
      float sum = 0.0f;
      for (int64_t j = 0; j < n; ++j) {
        lg[j] = expf(lg[j] - mx);
        sum += lg[j];
      }
      float* ph = part + h * (g.hdv + 2);
      std::fill_n(ph, g.hdv, 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float w = lg[j];
        const float* v = vt + j * g.hdv;
        for (int64_t d = 0; d < g.hdv; ++d) ph[d] += w * v[d];
      }
      ph[g.hdv] = mx;
      ph[g.hdv + 1] = sum;
    }
  }
}

void state_init(const Geometry& g, float* state) {
  for (int64_t h = 0; h < g.nh; ++h) {
    std::fill_n(state + h * (g.hdv + 2), g.hdv, 0.0f);
    state[h * (g.hdv + 2) + g.hdv] = -INFINITY;
    state[h * (g.hdv + 2) + g.hdv + 1] = 0.0f;
  }
}

void fold(const Geometry& g, const float* part, float* state) {
  const int64_t ps = g.hdv + 2;
  for (int64_t h = 0; h < g.nh; ++h) {
    const float* p = part + h * ps;
    float* s = state + h * ps;
    const float m = std::max(s[g.hdv], p[g.hdv]);
    const float alpha = expf(s[g.hdv] - m), beta = expf(p[g.hdv] - m);
    s[g.hdv] = m;
    s[g.hdv + 1] = s[g.hdv + 1] * alpha + p[g.hdv + 1] * beta;
    for (int64_t d = 0; d < g.hdv; ++d) s[d] = s[d] * alpha + p[d] * beta;
  }
}

void finish(const KvCodecAttentionArgs& a, const Geometry& g, int32_t t, const float* state) {
  const bool rotated = g.rotated;
  float signs[1024];
  for (int64_t h = 0; h < g.nh; ++h) {
    const float* s = state + h * (g.hdv + 2);
    float* out = a.out + (int64_t(t) * g.nh + h) * g.hdv;
    const float inv = 1.0f / s[g.hdv + 1];
    for (int64_t d = 0; d < g.hdv; ++d) out[d] = s[d] * inv;
    if (rotated) {
      kv_rotation_signs(kv_rotation_seed(a.seed_layer, int32_t(h / g.group)), int32_t(g.hdv), signs);
      reference::kv_unrotate(out, int32_t(g.hdv), signs);
    }
  }
}

}  // namespace

void paged_attention_codec(ThreadPool& pool, const KvCodecAttentionArgs& a) {
  STRATA_CHECK(a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0, "paged_attention_codec: n_heads % n_kv_heads != 0");
  STRATA_CHECK(a.v_fmt.dim <= 1024, "paged_attention_codec: head dim above 1024");
  STRATA_CHECK(a.n_prefix_blocks == 0 || (a.k_fmt_prefix.dim == a.k_fmt.dim && a.v_fmt_prefix.dim == a.v_fmt.dim &&
                                          a.k_pool_prefix != nullptr && a.v_pool_prefix != nullptr),
               "paged_attention_codec: prefix pools missing or head dims differ");
  if (a.n_q <= 0) return;
  const Geometry g(a);
  const size_t scratch_floats = size_t(g.scratch_floats() + 3 * g.part_floats());
  auto thread_scratch = [scratch_floats]() {
    thread_local std::vector<float> scratch;  // grown once per thread, reused by later calls
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    return scratch.data();
  };

  if (a.n_q >= 2 * pool.size()) {
    // Query-per-task, queries taken from both ends so later (longer) queries spread out.
    const int32_t nq = a.n_q;
    pool.parallel_for(nq, [&](int64_t b, int64_t e, int) {
      float* scratch = thread_scratch();
      float* part = scratch + g.scratch_floats();
      float* state = part + g.part_floats();
      for (int64_t i = b; i < e; ++i) {
        const int32_t t = (i % 2 == 0) ? int32_t(i / 2) : int32_t(nq - 1 - i / 2);
        state_init(g, state);
        const int64_t lo = first_key(a, t), end = int64_t(a.pos0) + t + 1;
        for (int64_t k0 = lo; k0 < end; k0 += kSegment) {
          segment(a, g, t, k0, std::min(end, k0 + kSegment), scratch, part);
          fold(g, part, state);
        }
        finish(a, g, t, state);
      }
    });
    return;
  }

  // Segment-per-task (decode and short chunks), then one fold per query.
  thread_local std::vector<int64_t> first_task;  // [n_q + 1]
  thread_local std::vector<float> parts;         // [n_tasks, part_floats]
  first_task.assign(size_t(a.n_q) + 1, 0);
  for (int32_t t = 0; t < a.n_q; ++t) first_task[size_t(t) + 1] = first_task[size_t(t)] + n_segments(a, t);
  const int64_t n_tasks = first_task[size_t(a.n_q)];
  if (parts.size() < size_t(n_tasks * g.part_floats())) parts.resize(size_t(n_tasks * g.part_floats()));
  const int64_t* first = first_task.data();
  float* part_buf = parts.data();
  pool.parallel_for(n_tasks, [&](int64_t b, int64_t e, int) {
    float* scratch = thread_scratch();
    int32_t t = int32_t(std::upper_bound(first, first + a.n_q + 1, b) - first) - 1;
    for (int64_t i = b; i < e; ++i) {
      while (i >= first[t + 1]) ++t;
      const int64_t lo = first_key(a, t), end = int64_t(a.pos0) + t + 1;
      const int64_t k0 = lo + (i - first[t]) * kSegment;
      segment(a, g, t, k0, std::min(end, k0 + kSegment), scratch, part_buf + i * g.part_floats());
    }
  });
  pool.parallel_for(a.n_q, [&](int64_t b, int64_t e, int) {
    float* state = thread_scratch() + g.scratch_floats();
    for (int64_t t = b; t < e; ++t) {
      state_init(g, state);
      for (int64_t i = first[t]; i < first[t + 1]; ++i) fold(g, part_buf + i * g.part_floats(), state);
      finish(a, g, int32_t(t), state);
    }
  });
}

void kv_write_rows(ThreadPool& pool, const KvRowFormat& fmt, int32_t seed_layer, int32_t n_kv_heads, const float* x,
                   const int64_t* slots, int64_t n_rows, uint8_t* pool_rows) {
  const int64_t bytes = fmt.bytes();
  pool.parallel_for(n_rows, [&](int64_t b, int64_t e, int) {
    for (int64_t r = b; r < e; ++r) {
      for (int32_t h = 0; h < n_kv_heads; ++h) {
        reference::kv_encode_row(fmt, x + (r * n_kv_heads + h) * fmt.dim,
                                 pool_rows + (slots[r] * n_kv_heads + h) * bytes, kv_rotation_seed(seed_layer, h));
      }
    }
  });
}

void kv_convert_rows(const KvRowFormat& from, int32_t from_layer, const uint8_t* src, const KvRowFormat& to,
                     int32_t to_layer, uint8_t* dst, int64_t n_rows, int32_t n_kv_heads) {
  STRATA_CHECK(from.dim == to.dim && from.dim <= 1024, "kv_convert_rows: head dims differ or exceed 1024");
  float x[1024];
  const int64_t fb = from.bytes(), tb = to.bytes();
  for (int64_t r = 0; r < n_rows; ++r) {
    const int32_t h = int32_t(r % n_kv_heads);
    reference::kv_decode_row(from, src + r * fb, x, kv_rotation_seed(from_layer, h));
    reference::kv_encode_row(to, x, dst + r * tb, kv_rotation_seed(to_layer, h));
  }
}

}  // namespace strata::cpu
