// Delayed quantization on the GPU (KvCodecStep with quant_specs): convert_blocks writes the
// codec bytes reference::kv_encode_row gives for the exact rows (bf16 and f32 exact rows, every
// codec), so does convert_all_blocks for two layers at once (one launch, and layer by layer),
// and the two-source attention (a row's first n_quant_blocks blocks in the codec pool,
// the rest in the exact pool) matches a plain host softmax over the decoded codec keys and the
// exact keys within max-norm relative error 1e-2: decode rows and prefill-chunk rows with their
// causal limits, no codec blocks, some, and all but the block being written, GQA groups 1, 4
// and 8, head dims 64 and 128, 1 to 7 splits per pass, tensor-core and CUDA-core kernels. The
// converted exact blocks are poisoned (NaN) before attention, so reading them fails. With one
// split per pass a row's output does not depend on the batch. Needs a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <functional>
#include <numeric>

#include "backend/cuda/kv_codec.h"
#include "backend/reference/kv_codec.h"
#include "gpu_test_util.h"
#include "runtime/cuda/cuda_kv_codec_step.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

constexpr int32_t kLayer = 1;  // the layer under test (of 2): its turbo rotation seed

struct Seq {
  int32_t len;      // keys after the step (the step's query rows are its last n_q positions)
  int32_t n_q;      // query rows (1: decode, more: a prefill chunk)
  int32_t n_quant;  // blocks in the codec pool
};

struct Case {
  KvCodec codec;
  bool f32_exact;
  int32_t n_heads, n_kv_heads, head_dim;
  std::vector<Seq> seqs;
  std::vector<int32_t> splits;
  float softcap = 0.0f;
  int32_t block_size = 16;
  int32_t group = 0;  // affine group of the codec; 0: its default
};

ModelConfig config(int32_t n_heads, int32_t n_kv_heads, int32_t head_dim) {
  ModelConfig c;
  c.model_type = "llama";
  c.n_layers = 2;
  c.n_heads = n_heads;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = head_dim;
  c.hidden = n_heads * head_dim;
  return c;
}

// Values as a model makes them: a per-row scale; bf16 exact rows hold bf16 values.
std::vector<float> kv_values(std::mt19937& rng, int64_t n_rows, int32_t dim, bool round_bf16) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> sc(0.05f, 4.0f);
  std::vector<float> x(size_t(n_rows * dim));
  for (int64_t r = 0; r < n_rows; ++r) {
    const float s = sc(rng);
    for (int32_t i = 0; i < dim; ++i) {
      float v = nd(rng) * s;
      if (r % 97 == 5) v = 0.25f;  // constant rows: the codecs' zero-range paths
      if (round_bf16) v = bf16_to_f32(f32_to_bf16(v));
      x[size_t(r * dim + i)] = v;
    }
  }
  return x;
}

int64_t first_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return int64_t(i);
  }
  return -1;
}

void run_case(std::mt19937& rng, const Case& c) {
  SCOPED_TRACE(std::string(kv_codec_name(c.codec)) + (c.f32_exact ? " over f32" : " over bf16") + " heads " +
               std::to_string(c.n_heads) + "/" + std::to_string(c.n_kv_heads) + " head_dim " + std::to_string(c.head_dim));
  const int32_t bs = c.block_size, hd = c.head_dim, n_kv = c.n_kv_heads, n_heads = c.n_heads;
  const int32_t n_seqs = int32_t(c.seqs.size());
  int32_t n_tokens = 0, max_blocks = 0, n_exact_blocks = 0, n_codec_blocks = 0;
  for (const Seq& s : c.seqs) {
    ASSERT_LE(s.n_quant * bs, s.len - s.n_q) << "a query row's own block is exact";
    n_tokens += s.n_q;
    const int32_t nb = (s.len + bs - 1) / bs;
    max_blocks = std::max(max_blocks, nb);
    n_exact_blocks += nb;
    n_codec_blocks += s.n_quant;
  }
  n_exact_blocks += 3;  // spares stay unused
  n_codec_blocks += 2;

  const ModelConfig cfg = config(n_heads, n_kv, hd);
  const std::vector<KvCodecSpec> exact(2, KvCodecSpec{c.f32_exact ? KvCodec::kAuto : KvCodec::kBf16, 0});
  const std::vector<KvCodecSpec> quant(2, KvCodecSpec{c.codec, c.group});
  auto made = KvCodecStep::create(cfg, exact, n_tokens, 64, c.f32_exact, quant);
  ASSERT_TRUE(made.ok()) << made.error().to_string();
  KvCodecStep& step = **made;
  ASSERT_TRUE(step.has_quant());
  const KvRowFormat qkf = kv_key_format(quant[0], hd), qvf = kv_value_format(quant[0], hd);
  ASSERT_EQ(step.quant_k_format(kLayer).bytes, qkf.bytes());
  ASSERT_EQ(step.quant_v_format(kLayer).bytes, qvf.bytes());
  ASSERT_EQ(step.quant_row_bytes().size(), size_t(4));
  ASSERT_EQ(step.quant_row_bytes()[2], qkf.bytes());
  ASSERT_EQ(step.quant_row_bytes()[3], qvf.bytes());
  const int32_t eb = step.k_format(kLayer).bytes;
  ASSERT_EQ(eb, (c.f32_exact ? 4 : 2) * hd);

  // Block tables: exact blocks for every position (the first n_quant of them are converted and
  // then poisoned), codec blocks for the first n_quant; the attention's table holds the codec ids
  // first.
  std::vector<int32_t> exact_ids(static_cast<size_t>(n_exact_blocks)), codec_ids(static_cast<size_t>(n_codec_blocks));
  std::iota(exact_ids.begin(), exact_ids.end(), 0);
  std::iota(codec_ids.begin(), codec_ids.end(), 0);
  std::shuffle(exact_ids.begin(), exact_ids.end(), rng);
  std::shuffle(codec_ids.begin(), codec_ids.end(), rng);
  std::vector<int32_t> exact_table(size_t(n_seqs) * max_blocks, 0), tables(exact_table.size(), 0);
  std::vector<int32_t> src_blocks, dst_blocks;
  size_t next_e = 0, next_c = 0;
  for (int32_t s = 0; s < n_seqs; ++s) {
    const Seq& q = c.seqs[size_t(s)];
    for (int32_t b = 0; b < (q.len + bs - 1) / bs; ++b) {
      const int32_t e = exact_ids[next_e++];
      exact_table[size_t(s * max_blocks + b)] = e;
      tables[size_t(s * max_blocks + b)] = e;
      if (b < q.n_quant) {
        const int32_t d = codec_ids[next_c++];
        tables[size_t(s * max_blocks + b)] = d;
        src_blocks.push_back(e);
        dst_blocks.push_back(d);
      }
    }
  }

  // Values of every (sequence, position, KV head); the exact pools hold them.
  std::vector<int64_t> seq_row0(size_t(n_seqs) + 1, 0);
  for (int32_t s = 0; s < n_seqs; ++s) seq_row0[size_t(s) + 1] = seq_row0[size_t(s)] + c.seqs[size_t(s)].len;
  const int64_t n_pos = seq_row0.back();
  const std::vector<float> kx = kv_values(rng, n_pos * n_kv, hd, !c.f32_exact);
  const std::vector<float> vx = kv_values(rng, n_pos * n_kv, hd, !c.f32_exact);
  const size_t pool_rows = size_t(n_exact_blocks) * bs * n_kv;
  std::vector<uint8_t> k_exact(pool_rows * size_t(eb), 0), v_exact(pool_rows * size_t(eb), 0);
  auto slot_of = [&](const std::vector<int32_t>& table, int32_t s, int32_t p) {
    return int64_t(table[size_t(s * max_blocks + p / bs)]) * bs + p % bs;
  };
  for (int32_t s = 0; s < n_seqs; ++s) {
    for (int32_t p = 0; p < c.seqs[size_t(s)].len; ++p) {
      for (int32_t h = 0; h < n_kv; ++h) {
        const size_t src = size_t(((seq_row0[size_t(s)] + p) * n_kv + h) * hd);
        const size_t dst = size_t((slot_of(exact_table, s, p) * n_kv + h) * eb);
        for (int32_t d = 0; d < hd; ++d) {
          if (c.f32_exact) {
            std::memcpy(&k_exact[dst + 4 * size_t(d)], &kx[src + size_t(d)], 4);
            std::memcpy(&v_exact[dst + 4 * size_t(d)], &vx[src + size_t(d)], 4);
          } else {
            const uint16_t kb = f32_to_bf16(kx[src + size_t(d)]), vb = f32_to_bf16(vx[src + size_t(d)]);
            std::memcpy(&k_exact[dst + 2 * size_t(d)], &kb, 2);
            std::memcpy(&v_exact[dst + 2 * size_t(d)], &vb, 2);
          }
        }
      }
    }
  }
  // The codec pools the reference encoder makes from the same values.
  const size_t codec_rows = size_t(n_codec_blocks) * bs * n_kv;
  std::vector<uint8_t> qk_ref(codec_rows * size_t(qkf.bytes()), 0), qv_ref(codec_rows * size_t(qvf.bytes()), 0);
  for (int32_t s = 0; s < n_seqs; ++s) {
    for (int32_t p = 0; p < c.seqs[size_t(s)].n_quant * bs; ++p) {
      for (int32_t h = 0; h < n_kv; ++h) {
        const size_t src = size_t(((seq_row0[size_t(s)] + p) * n_kv + h) * hd);
        const int64_t row = slot_of(tables, s, p) * n_kv + h;
        const uint64_t seed = kv_rotation_seed(kLayer, h);
        reference::kv_encode_row(qkf, &kx[src], &qk_ref[size_t(row * qkf.bytes())], seed);
        reference::kv_encode_row(qvf, &vx[src], &qv_ref[size_t(row * qvf.bytes())], seed);
      }
    }
  }

  DeviceBuffer<uint8_t> k_pool(k_exact.size()), v_pool(v_exact.size()), qk_pool(qk_ref.size()), qv_pool(qv_ref.size());
  k_pool.upload(k_exact);
  v_pool.upload(v_exact);
  ASSERT_CUDA_OK(cudaMemset(qk_pool.p, 0, qk_ref.size()));
  ASSERT_CUDA_OK(cudaMemset(qv_pool.p, 0, qv_ref.size()));
  DeviceBuffer<int32_t> d_src(src_blocks.size()), d_dst(dst_blocks.size());
  d_src.upload(src_blocks);
  d_dst.upload(dst_blocks);
  step.convert_blocks(kLayer, k_pool.p, v_pool.p, qk_pool.p, qv_pool.p, d_src.p, d_dst.p, int32_t(src_blocks.size()), bs, nullptr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  {
    const std::vector<uint8_t> qk = qk_pool.download(), qv = qv_pool.download();
    const int64_t kd = first_diff(qk, qk_ref), vd = first_diff(qv, qv_ref);
    EXPECT_EQ(kd, -1) << "converted key bytes differ first at row " << kd / qkf.bytes() << ", byte " << kd % qkf.bytes();
    EXPECT_EQ(vd, -1) << "converted value bytes differ first at row " << vd / qvf.bytes() << ", byte " << vd % qvf.bytes();
  }
  // Every layer at once (convert_all_blocks; the decoder's path): layer 0 holds the same exact
  // rows in pools of its own, its codec rows use its own turbo rotation. One launch and layer
  // by layer give the reference's bytes in both layers.
  {
    std::vector<uint8_t> qk_ref0(qk_ref.size(), 0), qv_ref0(qv_ref.size(), 0);
    for (int32_t s = 0; s < n_seqs; ++s) {
      for (int32_t p = 0; p < c.seqs[size_t(s)].n_quant * bs; ++p) {
        for (int32_t h = 0; h < n_kv; ++h) {
          const size_t src = size_t(((seq_row0[size_t(s)] + p) * n_kv + h) * hd);
          const int64_t row = slot_of(tables, s, p) * n_kv + h;
          const uint64_t seed = kv_rotation_seed(0, h);
          reference::kv_encode_row(qkf, &kx[src], &qk_ref0[size_t(row * qkf.bytes())], seed);
          reference::kv_encode_row(qvf, &vx[src], &qv_ref0[size_t(row * qvf.bytes())], seed);
        }
      }
    }
    EXPECT_TRUE(step.uniform_convert());
    DeviceBuffer<uint8_t> k0(k_exact.size()), v0(v_exact.size()), qk0(qk_ref.size()), qv0(qv_ref.size()), qk1(qk_ref.size()),
        qv1(qv_ref.size());
    k0.upload(k_exact);
    v0.upload(v_exact);
    for (bool fused : {true, false}) {
      SCOPED_TRACE(fused ? "all layers in one launch" : "all layers, one at a time");
      for (DeviceBuffer<uint8_t>* b : {&qk0, &qv0, &qk1, &qv1}) ASSERT_CUDA_OK(cudaMemset(b->p, 0, b->n));
      KvCodecStep::set_fused_convert(fused);
      step.convert_all_blocks({k0.p, v0.p, k_pool.p, v_pool.p}, {qk0.p, qv0.p, qk1.p, qv1.p}, d_src.p, d_dst.p,
                              int32_t(src_blocks.size()), bs, nullptr);
      KvCodecStep::set_fused_convert(true);
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint8_t>* refs[4] = {&qk_ref0, &qv_ref0, &qk_ref, &qv_ref};
      DeviceBuffer<uint8_t>* got[4] = {&qk0, &qv0, &qk1, &qv1};
      for (int part = 0; part < 4; ++part) {
        const int64_t d = first_diff(got[part]->download(), *refs[part]);
        const int32_t rb = part % 2 == 0 ? qkf.bytes() : qvf.bytes();
        EXPECT_EQ(d, -1) << "layer " << part / 2 << (part % 2 == 0 ? " key" : " value") << " bytes differ first at row " << d / rb
                         << ", byte " << d % rb;
      }
    }
  }
  // The converted exact blocks are freed in the engine: poison them (NaN rows).
  for (int32_t e : src_blocks) {
    const size_t off = size_t(e) * bs * n_kv * eb, n = size_t(bs) * n_kv * eb;
    ASSERT_CUDA_OK(cudaMemset(k_pool.p + off, 0xff, n));
    ASSERT_CUDA_OK(cudaMemset(v_pool.p + off, 0xff, n));
  }

  // What the attention sees at each (sequence, position, KV head): the decoded codec row below
  // the sequence's codec keys, the exact values above.
  std::vector<float> k_seen = kx, v_seen = vx;
  for (int32_t s = 0; s < n_seqs; ++s) {
    for (int32_t p = 0; p < c.seqs[size_t(s)].n_quant * bs; ++p) {
      for (int32_t h = 0; h < n_kv; ++h) {
        const size_t dst = size_t(((seq_row0[size_t(s)] + p) * n_kv + h) * hd);
        const int64_t row = slot_of(tables, s, p) * n_kv + h;
        const uint64_t seed = kv_rotation_seed(kLayer, h);
        reference::kv_decode_row(qkf, &qk_ref[size_t(row * qkf.bytes())], &k_seen[dst], seed);
        reference::kv_decode_row(qvf, &qv_ref[size_t(row * qvf.bytes())], &v_seen[dst], seed);
      }
    }
  }

  // Query rows and the host reference (double sums, one softmax over every visible key).
  std::vector<int32_t> positions, seq_q_start{0}, n_quant;
  std::vector<int32_t> row_seq;
  for (int32_t s = 0; s < n_seqs; ++s) {
    const Seq& q = c.seqs[size_t(s)];
    for (int32_t i = 0; i < q.n_q; ++i) {
      positions.push_back(q.len - q.n_q + i);
      row_seq.push_back(s);
    }
    seq_q_start.push_back(int32_t(positions.size()));
    n_quant.push_back(q.n_quant);
  }
  const Bf16Data qd = random_bf16(rng, size_t(n_tokens) * n_heads * hd, 1.0f);
  const float scale = 1.0f / std::sqrt(float(hd));
  const int32_t group = n_heads / n_kv;
  std::vector<float> ref(qd.f.size());
  for (int32_t t = 0; t < n_tokens; ++t) {
    const int32_t s = row_seq[size_t(t)], limit = positions[size_t(t)] + 1;
    for (int32_t h = 0; h < n_heads; ++h) {
      const int32_t kvh = h / group;
      const float* qv = &qd.f[size_t((t * n_heads + h) * hd)];
      std::vector<double> logit(static_cast<size_t>(limit));
      double mx = -INFINITY;
      for (int32_t j = 0; j < limit; ++j) {
        const float* kr = &k_seen[size_t(((seq_row0[size_t(s)] + j) * n_kv + kvh) * hd)];
        double dot = 0.0;
        for (int32_t d = 0; d < hd; ++d) dot += double(qv[d]) * double(kr[d]);
        double x = dot * scale;
        if (c.softcap > 0.0f) x = c.softcap * std::tanh(x / c.softcap);
        logit[size_t(j)] = x;
        mx = std::max(mx, x);
      }
      std::vector<double> o(static_cast<size_t>(hd), 0.0);
      double sum = 0.0;
      for (int32_t j = 0; j < limit; ++j) {
        const double e = std::exp(logit[size_t(j)] - mx);
        sum += e;
        const float* vr = &v_seen[size_t(((seq_row0[size_t(s)] + j) * n_kv + kvh) * hd)];
        for (int32_t d = 0; d < hd; ++d) o[size_t(d)] += e * double(vr[d]);
      }
      for (int32_t d = 0; d < hd; ++d) ref[size_t((t * n_heads + h) * hd + d)] = float(o[size_t(d)] / sum);
    }
  }

  DeviceBuffer<int32_t> d_pos(positions.size()), d_start(seq_q_start.size()), d_nq(n_quant.size()), d_tables(tables.size());
  DeviceBuffer<uint16_t> d_q(qd.bits.size()), d_out(qd.bits.size());
  DeviceBuffer<float> d_qf(qd.f.size());
  d_pos.upload(positions);
  d_start.upload(seq_q_start);
  d_nq.upload(n_quant);
  d_tables.upload(tables);
  d_q.upload(qd.bits);
  d_qf.upload(qd.f);
  PagedAttentionArgs attn{};
  attn.q = d_q.p;
  attn.out = d_out.p;
  attn.block_tables = d_tables.p;
  attn.n_tokens = n_tokens;
  attn.max_blocks_per_seq = max_blocks;
  attn.block_size = bs;
  attn.n_heads = n_heads;
  attn.n_kv_heads = n_kv;
  attn.head_dim = hd;
  attn.scale = scale;
  attn.softcap = c.softcap;
  const int64_t q_stride = int64_t(n_heads) * hd;
  for (bool mma : {true, false}) {
    set_kv_codec_attention_mma(mma);
    for (int32_t n_splits : c.splits) {
      SCOPED_TRACE(std::string(mma ? "tensor-core" : "CUDA-core") + ", splits " + std::to_string(n_splits));
      d_out.poison();
      step.begin_step(d_pos.p, d_start.p, n_tokens, n_seqs, nullptr, d_nq.p, bs);
      step.attend(kLayer, attn, d_qf.p, q_stride, k_pool.p, v_pool.p, n_splits, nullptr, qk_pool.p, qv_pool.p);
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> got_bits = d_out.download();
      const double err = max_norm_rel(bf16_to_floats(got_bits), ref);
      std::printf("%-5s over %s heads %d/%d dim %d splits %d %s: max-norm rel err %.3e\n", kv_codec_name(c.codec),
                  c.f32_exact ? "f32 " : "bf16", n_heads, n_kv, hd, n_splits, mma ? "mma " : "core", err);
      EXPECT_LT(err, 1e-2);
      if (n_splits != 1) continue;
      // Batch invariance (one split per pass): the last sequence alone gives its rows the same bits.
      const int32_t s = n_seqs - 1, r0 = seq_q_start[size_t(s)], nr = seq_q_start[size_t(s) + 1] - r0;
      DeviceBuffer<int32_t> p1(static_cast<size_t>(nr)), st1(2), nq1(1), tb1(static_cast<size_t>(max_blocks));
      p1.upload(std::vector<int32_t>(positions.begin() + r0, positions.end()));
      st1.upload({0, nr});
      nq1.upload({n_quant[size_t(s)]});
      tb1.upload(std::vector<int32_t>(tables.begin() + long(s) * max_blocks, tables.begin() + long(s + 1) * max_blocks));
      DeviceBuffer<uint16_t> out1(static_cast<size_t>(nr * q_stride));
      PagedAttentionArgs one = attn;
      one.q = d_q.p + int64_t(r0) * q_stride;
      one.out = out1.p;
      one.block_tables = tb1.p;
      one.n_tokens = nr;
      step.begin_step(p1.p, st1.p, nr, 1, nullptr, nq1.p, bs);
      step.attend(kLayer, one, d_qf.p + int64_t(r0) * q_stride, q_stride, k_pool.p, v_pool.p, 1, nullptr, qk_pool.p, qv_pool.p);
      const std::vector<uint16_t> alone = out1.download();
      EXPECT_TRUE(std::equal(alone.begin(), alone.end(), got_bits.begin() + long(r0) * q_stride))
          << "sequence " << s << " alone differs from its rows in the batch";
    }
  }
  set_kv_codec_attention_mma(true);
}

// Decode rows, a prefill chunk, a prefill from position 0; no codec blocks, some, and all but
// the block being written.
std::vector<Seq> mixed_seqs() {
  return {{1, 1, 0}, {37, 1, 2}, {300, 1, 10}, {70, 20, 3}, {48, 48, 0}, {1029, 1, 64}};
}

TEST(GpuKvCodecQuant, ConvertBytesAndTwoSourceAttentionMatchHost) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(fresh_seed());
  for (bool f32_exact : {false, true}) {
    for (KvCodec codec : {KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo, KvCodec::kBf16}) {
      // Llama-3.1-8B's head shape (GQA group 4).
      run_case(rng, {codec, f32_exact, 8, 2, 128, mixed_seqs(), {1, 3, 7}});
      // Head dim 64, no GQA, a soft-cap; a chunk whose first rows see no codec keys below its
      // own block and a sequence whose every earlier block is converted.
      run_case(rng, {codec, f32_exact, 4, 4, 64, {{33, 17, 1}, {200, 1, 12}, {16, 1, 0}}, {1, 4}, 30.0f});
      // GQA group 8, blocks of 32 tokens.
      run_case(rng, {codec, f32_exact, 16, 2, 128, {{77, 1, 2}, {500, 3, 15}}, {2, 1}, 0.0f, 32});
    }
  }
  // An affine group other than the default (int8 in groups of 32).
  run_case(rng, {KvCodec::kInt8, false, 8, 2, 128, mixed_seqs(), {1, 3}, 0.0f, 16, 32});
}

TEST(GpuKvCodecQuant, SupportedRefusesWhatTheCpuRefuses) {
  const ModelConfig cfg = config(8, 2, 128);
  const std::vector<KvCodecSpec> bf16(2, KvCodecSpec{KvCodec::kBf16, 0}), fp8(2, KvCodecSpec{KvCodec::kFp8, 0});
  EXPECT_TRUE(KvCodecStep::supported(cfg, bf16, false, fp8).ok());
  EXPECT_TRUE(KvCodecStep::supported(cfg, std::vector<KvCodecSpec>(2), true, fp8).ok());  // f32 exact rows
  // The exact pool must hold exact rows.
  Status s = KvCodecStep::supported(cfg, fp8, false, fp8);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(s.error().message.find("layer 0"), std::string::npos) << s.error().message;
  // One quant spec per layer.
  s = KvCodecStep::supported(cfg, bf16, false, {KvCodecSpec{KvCodec::kFp8, 0}});
  EXPECT_FALSE(s.ok());
  // Sliding-window layers keep their exact rows.
  ModelConfig win = cfg;
  win.layer_types = {"full_attention", "sliding_attention"};
  win.sliding_window = 64;
  s = KvCodecStep::supported(win, bf16, false, fp8);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(s.error().message.find("layer 1"), std::string::npos) << s.error().message;
  EXPECT_TRUE(KvCodecStep::supported(win, bf16).ok());  // without delayed quantization: fine
  // A checkpoint's config as parsed.
  auto llama = load_model_config(model_path("llama3-tiny"));
  ASSERT_TRUE(llama.ok());
  const std::vector<KvCodecSpec> exact(size_t(llama->n_layers), KvCodecSpec{KvCodec::kBf16, 0});
  for (KvCodec codec : {KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo}) {
    s = KvCodecStep::supported(*llama, exact, false, std::vector<KvCodecSpec>(size_t(llama->n_layers), KvCodecSpec{codec, 0}));
    EXPECT_TRUE(s.ok()) << kv_codec_name(codec) << ": " << s.error().message;
  }
}

// Timing, not a check (run with --gtest_also_run_disabled_tests): one layer's attention at
// Llama-3.1-8B's shape (32 heads, 8 KV heads, head dim 128), batch 64 decode rows with 8,192
// keys, blocks of 16: the codec rows alone, against delayed quantization (the first 511 blocks
// in the codec pool, the 16 keys of the last in bf16 rows), each median of 50 launches.
TEST(GpuKvCodecQuant, DISABLED_TwoSourceDecodeTiming) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  constexpr int32_t kSeqs = 64, kCtx = 8192, kBs = 16, kHeads = 32, kKv = 8, kHd = 128;
  constexpr int32_t kBlocks = kCtx / kBs;
  const ModelConfig cfg = config(kHeads, kKv, kHd);
  std::vector<int32_t> positions(kSeqs, kCtx - 1), start(kSeqs + 1), n_quant(kSeqs, kBlocks - 1), tables(size_t(kSeqs) * kBlocks);
  std::iota(start.begin(), start.end(), 0);
  std::iota(tables.begin(), tables.end(), 0);  // codec ids and exact ids alike: one pool slot per block
  std::mt19937 rng(7);
  std::shuffle(tables.begin(), tables.end(), rng);
  DeviceBuffer<int32_t> d_pos(positions.size()), d_start(start.size()), d_nq(n_quant.size()), d_tables(tables.size());
  d_pos.upload(positions);
  d_start.upload(start);
  d_nq.upload(n_quant);
  d_tables.upload(tables);
  DeviceBuffer<uint16_t> q(size_t(kSeqs) * kHeads * kHd), out(q.n);
  launch_fill_random_bf16(q.p, int64_t(q.n), 5, 1.0f, nullptr);
  const int64_t slots = int64_t(kSeqs) * kCtx;
  DeviceBuffer<uint16_t> x(size_t(slots) * kKv * kHd);  // every slot's K (and V) values
  launch_fill_random_bf16(x.p, int64_t(x.n), 9, 2.0f, nullptr);
  std::vector<int64_t> ids(static_cast<size_t>(slots));
  std::iota(ids.begin(), ids.end(), int64_t(0));
  DeviceBuffer<int64_t> d_slots(ids.size());
  d_slots.upload(ids);
  DeviceBuffer<uint8_t> exact_k(size_t(slots) * kKv * kHd * 2), exact_v(exact_k.n);
  ASSERT_CUDA_OK(cudaMemcpy(exact_k.p, x.p, exact_k.n, cudaMemcpyDeviceToDevice));
  ASSERT_CUDA_OK(cudaMemcpy(exact_v.p, x.p, exact_v.n, cudaMemcpyDeviceToDevice));
  PagedAttentionArgs attn{};
  attn.q = q.p;
  attn.out = out.p;
  attn.block_tables = d_tables.p;
  attn.n_tokens = kSeqs;
  attn.max_blocks_per_seq = kBlocks;
  attn.block_size = kBs;
  attn.n_heads = kHeads;
  attn.n_kv_heads = kKv;
  attn.head_dim = kHd;
  attn.scale = 1.0f / std::sqrt(float(kHd));
  cudaEvent_t e0, e1;
  ASSERT_CUDA_OK(cudaEventCreate(&e0));
  ASSERT_CUDA_OK(cudaEventCreate(&e1));
  auto median_ms = [&](const std::function<void()>& f) {
    std::vector<float> ms;
    f();  // warm-up
    for (int i = 0; i < 50; ++i) {
      cudaEventRecord(e0);
      f();
      cudaEventRecord(e1);
      cudaEventSynchronize(e1);
      float t = 0.0f;
      cudaEventElapsedTime(&t, e0, e1);
      ms.push_back(t);
    }
    std::sort(ms.begin(), ms.end());
    return double(ms[ms.size() / 2]);
  };
  for (KvCodec codec : {KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo}) {
    const std::vector<KvCodecSpec> codecs(2, KvCodecSpec{codec, 0}), bf16(2, KvCodecSpec{KvCodec::kBf16, 0});
    auto single = KvCodecStep::create(cfg, codecs, kSeqs, kSeqs);
    auto quant = KvCodecStep::create(cfg, bf16, kSeqs, kSeqs, false, codecs);
    ASSERT_TRUE(single.ok() && quant.ok());
    const KvRowLayout kf = (*single)->k_format(kLayer), vf = (*single)->v_format(kLayer);
    DeviceBuffer<uint8_t> ck(size_t(slots) * kKv * size_t(kf.bytes)), cv(size_t(slots) * kKv * size_t(vf.bytes));
    launch_kv_codec_write({x.p, d_slots.p, ck.p, kf, int32_t(slots), kKv, kLayer}, nullptr);
    launch_kv_codec_write({x.p, d_slots.p, cv.p, vf, int32_t(slots), kKv, kLayer}, nullptr);
    const int32_t splits = (*single)->splits_for(kSeqs, false);
    (*single)->begin_step(d_pos.p, d_start.p, kSeqs, kSeqs, nullptr);
    const double one = median_ms([&] { (*single)->attend(kLayer, attn, nullptr, 0, ck.p, cv.p, splits, nullptr); });
    (*quant)->begin_step(d_pos.p, d_start.p, kSeqs, kSeqs, nullptr, d_nq.p, kBs);
    const double two =
        median_ms([&] { (*quant)->attend(kLayer, attn, nullptr, 0, exact_k.p, exact_v.p, splits, nullptr, ck.p, cv.p); });
    ASSERT_CUDA_OK(cudaDeviceSynchronize());
    std::printf("%-5s batch %d x %d keys, %d splits: codec rows alone %.3f ms per layer, delayed quantization %.3f ms (%.3fx)\n",
                kv_codec_name(codec), kSeqs, kCtx, splits, one, two, two / one);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
}

}  // namespace
}  // namespace strata::cuda
