// Paged attention against reference::paged_attention on random bf16 data: ragged packed
// prefill (causal, GQA, sliding window, soft-cap, shuffled block tables, cached prefixes) and
// split-KV decode. Needs a GPU.
#include <gtest/gtest.h>

#include <numeric>

#include "backend/cuda/kernels.h"
#include "backend/reference/reference_ops.h"
#include "gpu_test_util.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

struct Seq {
  int32_t n_q;
  int32_t pos0;
};

struct Config {
  int32_t n_heads, n_kv_heads, head_dim, block_size, window;
  float softcap;
  std::vector<Seq> seqs;
  int32_t n_splits;
  bool flash_direct = false;  // launch the tensor-core kernel itself (with splits too)
};

void run_case(std::mt19937& rng, const Config& c) {
  const int32_t max_blocks = 64;
  const int32_t n_seqs = int32_t(c.seqs.size());
  const int32_t n_blocks_pool = n_seqs * max_blocks;
  const size_t row = size_t(c.n_kv_heads) * c.head_dim;
  const Bf16Data kp = random_bf16(rng, size_t(n_blocks_pool) * c.block_size * row, 1.0f);
  const Bf16Data vp = random_bf16(rng, kp.bits.size(), 1.0f);
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks_pool));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(static_cast<size_t>(n_seqs) * max_blocks), q_start(static_cast<size_t>(n_seqs) + 1),
      pos0(static_cast<size_t>(n_seqs)), tile_seq, tile_q0;
  const int32_t group = c.n_heads / c.n_kv_heads;
  const int32_t tpt = c.flash_direct ? std::max(1, flash_attention_rows() / group)
                                     : attention_tokens_per_tile(c.n_heads, c.n_kv_heads, c.head_dim, c.n_splits);
  int32_t n_tokens = 0;
  for (int32_t s = 0; s < n_seqs; ++s) {
    for (int32_t b = 0; b < max_blocks; ++b) tables[size_t(s) * max_blocks + b] = perm[size_t(s) * max_blocks + b];
    q_start[size_t(s)] = n_tokens;
    pos0[size_t(s)] = c.seqs[size_t(s)].pos0;
    ASSERT_LE(c.seqs[size_t(s)].pos0 + c.seqs[size_t(s)].n_q, max_blocks * c.block_size);
    for (int32_t q0 = 0; q0 < c.seqs[size_t(s)].n_q; q0 += tpt) {
      tile_seq.push_back(s);
      tile_q0.push_back(q0);
    }
    n_tokens += c.seqs[size_t(s)].n_q;
  }
  q_start[size_t(n_seqs)] = n_tokens;
  const Bf16Data q = random_bf16(rng, size_t(n_tokens) * c.n_heads * c.head_dim, 1.0f);
  const float scale = float(1.0 / std::sqrt(double(c.head_dim))) * 2.0f;  // sharper than usual: a peaky softmax

  std::vector<float> ref(q.f.size());
  for (int32_t s = 0; s < n_seqs; ++s) {
    cpu::PagedAttentionArgs a;
    a.q = q.f.data() + size_t(q_start[size_t(s)]) * c.n_heads * c.head_dim;
    a.out = ref.data() + size_t(q_start[size_t(s)]) * c.n_heads * c.head_dim;
    a.k_pool = kp.f.data();
    a.v_pool = vp.f.data();
    a.block_table = tables.data() + size_t(s) * max_blocks;
    a.block_size = c.block_size;
    a.n_q = c.seqs[size_t(s)].n_q;
    a.pos0 = c.seqs[size_t(s)].pos0;
    a.n_heads = c.n_heads;
    a.n_kv_heads = c.n_kv_heads;
    a.head_dim = c.head_dim;
    a.head_dim_v = c.head_dim;
    a.scale = scale;
    a.softcap = c.softcap;
    a.window = c.window;
    reference::paged_attention(a);
  }

  DeviceBuffer<uint16_t> dq(q.bits.size()), dout(q.bits.size()), dk(kp.bits.size()), dv(vp.bits.size());
  DeviceBuffer<int32_t> dtables(tables.size()), dqs(q_start.size()), dpos0(pos0.size()), dts(tile_seq.size()),
      dtq(tile_q0.size());
  DeviceBuffer<float> dpo(size_t(c.n_splits) * q.bits.size()), dpml(size_t(c.n_splits) * n_tokens * c.n_heads * 2);
  dq.upload(q.bits);
  dk.upload(kp.bits);
  dv.upload(vp.bits);
  dtables.upload(tables);
  dqs.upload(q_start);
  dpos0.upload(pos0);
  dts.upload(tile_seq);
  dtq.upload(tile_q0);
  dout.poison();
  PagedAttentionArgs a{};
  a.q = dq.p;
  a.out = dout.p;
  a.k_pool = dk.p;
  a.v_pool = dv.p;
  a.block_tables = dtables.p;
  a.seq_q_start = dqs.p;
  a.seq_pos0 = dpos0.p;
  a.tile_seq = dts.p;
  a.tile_q0 = dtq.p;
  a.partial_out = dpo.p;
  a.partial_ml = dpml.p;
  a.n_tokens = n_tokens;
  a.n_tiles = int32_t(tile_seq.size());
  a.tokens_per_tile = tpt;
  a.n_splits = c.n_splits;
  a.max_blocks_per_seq = max_blocks;
  a.block_size = c.block_size;
  a.n_heads = c.n_heads;
  a.n_kv_heads = c.n_kv_heads;
  a.head_dim = c.head_dim;
  a.window = c.window;
  a.scale = scale;
  a.softcap = c.softcap;
  if (c.flash_direct) {
    launch_flash_attention(a, nullptr);
  } else {
    launch_paged_attention(a, nullptr);
  }
  launch_attention_combine(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_LE(max_norm_rel(bf16_to_floats(dout.download()), ref), 1e-2)
      << "heads " << c.n_heads << "/" << c.n_kv_heads << " head_dim " << c.head_dim << " window " << c.window
      << " softcap " << c.softcap << " splits " << c.n_splits << " flash " << c.flash_direct;
}

class GpuAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    rng_.seed(fresh_seed());
  }
  std::mt19937 rng_;
};

TEST_F(GpuAttention, RaggedPrefillCausalGqa) {
  // A fresh prompt, a chunk after a cached prefix, a single token, and a long prompt.
  const std::vector<Seq> seqs = {{37, 0}, {5, 20}, {1, 100}, {130, 0}};
  run_case(rng_, {8, 2, 64, 16, 0, 0.0f, seqs, 1});
  run_case(rng_, {32, 8, 128, 16, 0, 0.0f, seqs, 1});
  run_case(rng_, {4, 4, 8, 4, 0, 0.0f, seqs, 1});     // head_dim 8 (stories260k), no GQA
  run_case(rng_, {14, 2, 64, 16, 0, 0.0f, seqs, 1});  // group of 7
}

TEST_F(GpuAttention, SlidingWindowAndSoftcap) {
  const std::vector<Seq> seqs = {{70, 0}, {9, 40}};
  run_case(rng_, {8, 4, 128, 16, 16, 0.0f, seqs, 1});
  run_case(rng_, {8, 4, 128, 16, 0, 30.0f, seqs, 1});
  run_case(rng_, {4, 2, 256, 8, 24, 50.0f, seqs, 1});
}

// The tensor-core kernel on every head_dim it takes: several 64-key tiles per query tile,
// partial last tiles, full 64-row tiles and a group of 7 (63 rows).
TEST_F(GpuAttention, TensorCorePrefillHeadDims) {
  const std::vector<Seq> seqs = {{300, 0}, {64, 200}, {1, 511}, {130, 17}};
  for (const int32_t hd : {16, 32, 64, 128}) run_case(rng_, {16, 4, hd, 16, 0, 0.0f, seqs, 1});
  run_case(rng_, {14, 2, 128, 16, 0, 0.0f, seqs, 1});
  run_case(rng_, {8, 8, 64, 16, 0, 0.0f, seqs, 1});   // no GQA
  run_case(rng_, {32, 8, 128, 16, 100, 20.0f, seqs, 1});  // window and soft-cap across tiles
  run_case(rng_, {4, 2, 32, 8, 37, 0.0f, seqs, 1});
  run_case(rng_, {8, 2, 64, 12, 0, 0.0f, seqs, 1});  // block size not a power of two
}

TEST_F(GpuAttention, TensorCoreSplits) {
  const std::vector<Seq> seqs = {{1, 511}, {70, 300}, {1, 0}, {1, 900}};
  for (const int32_t splits : {2, 5}) {
    Config c{32, 8, 128, 16, 0, 0.0f, seqs, splits};
    c.flash_direct = true;
    run_case(rng_, c);
  }
  Config w{8, 2, 64, 16, 100, 0.0f, seqs, 3};
  w.flash_direct = true;
  run_case(rng_, w);
}

TEST_F(GpuAttention, SplitKvDecode) {
  const std::vector<Seq> seqs = {{1, 511}, {1, 37}, {1, 0}, {1, 900}};
  for (const int32_t splits : {1, 2, 5, 16}) run_case(rng_, {32, 8, 128, 16, 0, 0.0f, seqs, splits});
  run_case(rng_, {8, 2, 64, 16, 100, 0.0f, seqs, 7});  // window with splits
}

// Every tile one decode token (the tensor-core decode kernel): contexts around its 64-key tiles,
// groups of 4, 7 and 16 rows, head_dim 64 and 128, splits, window, soft-cap, a block size that
// is not a power of two; and the same shape through the kernels it replaces.
TEST_F(GpuAttention, TensorCoreDecodeBatch) {
  const std::vector<Seq> seqs = {{1, 0}, {1, 1}, {1, 63}, {1, 64}, {1, 65}, {1, 200}, {1, 511}, {1, 700}, {1, 1000}, {1, 37}};
  const std::vector<Seq> short_seqs = {{1, 0}, {1, 63}, {1, 130}, {1, 700}, {1, 500}};
  for (const int32_t splits : {1, 3}) {
    run_case(rng_, {32, 8, 128, 16, 0, 0.0f, seqs, splits});
    run_case(rng_, {14, 2, 64, 16, 0, 0.0f, seqs, splits});  // group of 7
    run_case(rng_, {16, 1, 128, 16, 0, 0.0f, seqs, splits});  // group of 16: every row of the m16 tile
  }
  run_case(rng_, {8, 2, 64, 12, 100, 30.0f, short_seqs, 2});  // window, soft-cap, block size 12
  run_case(rng_, {32, 8, 128, 16, 130, 0.0f, seqs, 1});      // window across tiles
  LaunchTuning t = launch_tuning();
  const LaunchTuning saved = t;
  t.decode_mma_attention = false;
  set_launch_tuning(t);
  run_case(rng_, {32, 8, 128, 16, 0, 0.0f, seqs, 1});
  run_case(rng_, {32, 8, 128, 16, 0, 0.0f, seqs, 3});
  set_launch_tuning(saved);
}

// Decode fusion: the attention kernel making q, k and v from the QKV projection itself and
// merging its splits in the last block, against launch_qkv_post + attention + combine (each
// checked against the reference above): outputs within bf16 tolerance, the pools' new rows
// equal.
void run_fused_decode_case(std::mt19937& rng, int32_t nh, int32_t nkv, int32_t hd, int32_t rot, bool bias, bool norm,
                           int32_t window, int32_t n_splits, const std::vector<int32_t>& pos) {
  const int32_t n = int32_t(pos.size()), bs = 16, max_blocks = 64;
  const int32_t rows = (nh + 2 * nkv) * hd;
  const size_t pool_elems = size_t(n) * max_blocks * bs * nkv * hd;
  const Bf16Data kp = random_bf16(rng, pool_elems, 1.0f);
  const Bf16Data vp = random_bf16(rng, pool_elems, 1.0f);
  const auto qkv = random_f32(rng, size_t(n) * rows, -2.0f, 2.0f);
  const auto qkv_bias = random_f32(rng, size_t(rows), -0.5f, 0.5f);
  const auto qn = random_f32(rng, size_t(hd), 0.5f, 1.5f);
  const auto kn = random_f32(rng, size_t(hd), 0.5f, 1.5f);
  std::vector<float> inv_freq(size_t(std::max(1, rot / 2)));
  for (size_t i = 0; i < inv_freq.size(); ++i) inv_freq[i] = float(std::pow(10000.0, -2.0 * double(i) / std::max(1, rot)));
  std::vector<int32_t> perm(size_t(n) * max_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const size_t n_seqs = static_cast<size_t>(n);
  std::vector<int32_t> tables = perm, q_start(n_seqs + 1), tile_seq(n_seqs), tile_q0(n_seqs, 0);
  std::vector<int64_t> slots(n_seqs);
  for (int32_t s = 0; s < n; ++s) {
    q_start[size_t(s)] = s;
    tile_seq[size_t(s)] = s;
    slots[size_t(s)] = int64_t(tables[size_t(s) * max_blocks + pos[size_t(s)] / bs]) * bs + pos[size_t(s)] % bs;
  }
  q_start[size_t(n)] = n;
  DeviceBuffer<float> dqkv(qkv.size()), dbias(qkv_bias.size()), dqn(qn.size()), dkn(kn.size()), dfreq(inv_freq.size());
  DeviceBuffer<int32_t> dpos(pos.size()), dtables(tables.size()), dqs(q_start.size()), dts(tile_seq.size()), dtq(tile_q0.size()),
      dcount(size_t(n) * nkv);
  DeviceBuffer<int64_t> dslots(slots.size());
  DeviceBuffer<uint16_t> dq(size_t(n) * nh * hd), dout_ref(dq.n), dout(dq.n), dk_ref(pool_elems), dv_ref(pool_elems),
      dk(pool_elems), dv(pool_elems);
  DeviceBuffer<float> dpo(size_t(n_splits) * dq.n), dpml(size_t(n_splits) * n * nh * 2);
  dqkv.upload(qkv);
  dbias.upload(qkv_bias);
  dqn.upload(qn);
  dkn.upload(kn);
  dfreq.upload(inv_freq);
  dpos.upload(pos);
  dtables.upload(tables);
  dqs.upload(q_start);
  dts.upload(tile_seq);
  dtq.upload(tile_q0);
  dslots.upload(slots);
  dk_ref.upload(kp.bits);
  dv_ref.upload(vp.bits);
  dk.upload(kp.bits);
  dv.upload(vp.bits);
  ASSERT_CUDA_OK(cudaMemset(dcount.p, 0, dcount.n * sizeof(int32_t)));
  QkvPostArgs post{};
  post.qkv = dqkv.p;
  post.bias = bias ? dbias.p : nullptr;
  post.q_norm = norm ? dqn.p : nullptr;
  post.k_norm = norm ? dkn.p : nullptr;
  post.positions = dpos.p;
  post.inv_freq = dfreq.p;
  post.slot_mapping = dslots.p;
  post.q_out = dq.p;
  post.k_pool = dk_ref.p;
  post.v_pool = dv_ref.p;
  post.n = n;
  post.n_heads = nh;
  post.n_kv_heads = nkv;
  post.head_dim = hd;
  post.rot_dim = rot;
  post.attn_factor = 1.0f;
  post.norm_eps = 1e-6f;
  PagedAttentionArgs a{};
  a.q = dq.p;
  a.out = dout_ref.p;
  a.k_pool = dk_ref.p;
  a.v_pool = dv_ref.p;
  a.block_tables = dtables.p;
  a.seq_q_start = dqs.p;
  a.seq_pos0 = dpos.p;  // one token per sequence: its position is the cached length
  a.tile_seq = dts.p;
  a.tile_q0 = dtq.p;
  a.partial_out = dpo.p;
  a.partial_ml = dpml.p;
  a.n_tokens = n;
  a.n_tiles = n;
  a.tokens_per_tile = 1;
  a.n_splits = n_splits;
  a.max_blocks_per_seq = max_blocks;
  a.block_size = bs;
  a.n_heads = nh;
  a.n_kv_heads = nkv;
  a.head_dim = hd;
  a.window = window;
  a.scale = float(1.0 / std::sqrt(double(hd)));
  dout_ref.poison();
  launch_qkv_post(post, nullptr);
  launch_paged_attention(a, nullptr);
  launch_attention_combine(a, nullptr);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

  post.k_pool = dk.p;
  post.v_pool = dv.p;
  a.k_pool = dk.p;
  a.v_pool = dv.p;
  a.out = dout.p;
  a.post = post;
  a.split_counters = dcount.p;
  dpo.poison();
  dout.poison();
  for (int rep = 0; rep < 2; ++rep) {  // twice: the counters must be back at 0 after a launch
    launch_paged_attention(a, nullptr);
    launch_attention_combine(a, nullptr);  // nothing to do: merged in the kernel
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::string what = "heads " + std::to_string(nh) + "/" + std::to_string(nkv) + " head_dim " + std::to_string(hd) +
                             " splits " + std::to_string(n_splits) + " window " + std::to_string(window) + " rep " +
                             std::to_string(rep);
    EXPECT_LE(max_norm_rel(bf16_to_floats(dout.download()), bf16_to_floats(dout_ref.download())), 1e-2) << what;
    EXPECT_LE(max_norm_rel(bf16_to_floats(dk.download()), bf16_to_floats(dk_ref.download())), 1e-2) << what << " k pool";
    EXPECT_LE(max_norm_rel(bf16_to_floats(dv.download()), bf16_to_floats(dv_ref.download())), 0.0) << what << " v pool";
    EXPECT_EQ(dcount.download(), std::vector<int32_t>(dcount.n, 0)) << what << " split counters";
  }
}

TEST_F(GpuAttention, FusedDecodeMatchesUnfused) {
  const std::vector<int32_t> pos = {511, 37, 0, 900, 16};
  for (const int32_t splits : {1, 2, 7, 32}) run_fused_decode_case(rng_, 32, 8, 128, 128, false, false, 0, splits, pos);
  run_fused_decode_case(rng_, 16, 2, 128, 128, true, true, 0, 32, pos);  // qwen3-like: bias, q/k norm
  run_fused_decode_case(rng_, 8, 2, 64, 32, true, false, 100, 5, pos);   // partial rotary, window
  run_fused_decode_case(rng_, 4, 4, 8, 8, false, false, 0, 3, pos);      // head_dim 8, no GQA
}

}  // namespace
}  // namespace strata::cuda
