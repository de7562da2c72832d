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

}  // namespace
}  // namespace strata::cuda
