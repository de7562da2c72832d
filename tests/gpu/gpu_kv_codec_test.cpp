// KV codecs on the GPU (backend/cuda/kv_codec.h) against the CPU: the encoder writes the same
// bytes as cpu::kv_write_rows (every format is bit-exact: the kernel repeats the reference's
// arithmetic), and the split-KV decode attention over those pools matches
// reference::paged_attention_codec within max-norm relative error 1e-2 (GQA groups 1, 4 and 8,
// head dims 64 and 128, ragged context lengths, shuffled block tables, 1 to 7 splits,
// soft-cap, blocks of 16 and of 1 token, default and other affine groups; the tensor-core
// kernel and the CUDA-core one at both occupancy caps). Needs a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/cpu/kv_codec.h"
#include "backend/cuda/kv_codec.h"
#include "backend/reference/kv_codec.h"
#include "backend/reference/kv_codec_attention.h"
#include "core/thread_pool.h"
#include "gpu_test_util.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

bool has_gpu() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

struct Case {
  KvCodec codec;
  int32_t n_heads, n_kv_heads, head_dim;
  std::vector<int32_t> context_lens;
  std::vector<int32_t> splits;
  float softcap = 0.0f;
  int32_t seed_layer = 3;
  int32_t block_size = 16;
  int32_t group_size = 0;  // affine groups; 0: the codec's default
};

// The split kernels a case runs: the tensor-core kernel where it takes the layout (else the
// CUDA-core one) at both of its occupancy variants, then the CUDA-core kernel at both caps.
struct Variant {
  bool mma;
  int32_t min_blocks;  // set_kv_codec_mma_blocks or set_kv_codec_attention_min_blocks
};
constexpr Variant kVariants[] = {{true, 3}, {true, 4}, {false, 3}, {false, 2}};

// Rows as a model makes them: a per-row scale (outlier heads and tokens), a few exact special
// rows (all equal, all zero) that hit the codecs' zero-scale paths.
Bf16Data kv_rows(std::mt19937& rng, int64_t n_rows, int32_t dim) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> sc(0.05f, 4.0f);
  Bf16Data d;
  d.bits.resize(size_t(n_rows * dim));
  d.f.resize(d.bits.size());
  for (int64_t r = 0; r < n_rows; ++r) {
    const float s = sc(rng);
    for (int32_t i = 0; i < dim; ++i) {
      float x = nd(rng) * s;
      if (r == 1) x = 0.5f;   // constant row
      if (r == 2) x = 0.0f;   // zero row
      if (r == 3 && i == 5) x = 300.0f;  // one large outlier
      const size_t k = size_t(r * dim + i);
      d.bits[k] = f32_to_bf16(x);
      d.f[k] = bf16_to_f32(d.bits[k]);
    }
  }
  return d;
}

// Index of the first differing byte, or -1.
int64_t first_diff(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i]) return int64_t(i);
  }
  return -1;
}

void run_case(std::mt19937& rng, ThreadPool& pool, const Case& c) {
  SCOPED_TRACE(std::string(kv_codec_name(c.codec)) + " heads " + std::to_string(c.n_heads) + "/" +
               std::to_string(c.n_kv_heads) + " head_dim " + std::to_string(c.head_dim) + " group " +
               std::to_string(c.group_size));
  const KvCodecSpec spec{c.codec, c.group_size};
  const KvRowFormat kf = kv_key_format(spec, c.head_dim), vf = kv_value_format(spec, c.head_dim);
  const KvRowLayout kl = kv_row_layout(kf), vl = kv_row_layout(vf);
  ASSERT_STREQ(kv_codec_gpu_problem(kl, vl), "");
  const int32_t block_size = c.block_size;
  const int32_t n_seqs = int32_t(c.context_lens.size());
  int32_t max_blocks = 0;
  for (int32_t len : c.context_lens) max_blocks = std::max(max_blocks, (len + block_size - 1) / block_size);
  const int32_t n_blocks_pool = n_seqs * max_blocks + 3;  // spare blocks stay unwritten
  std::vector<int32_t> perm(static_cast<size_t>(n_blocks_pool));
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int32_t> tables(size_t(n_seqs) * max_blocks, 0);
  for (int32_t s = 0; s < n_seqs; ++s) {
    for (int32_t b = 0; b < max_blocks; ++b) tables[size_t(s * max_blocks + b)] = perm[size_t(s * max_blocks + b)];
  }
  // Every cached token of every sequence, plus one token with slot -1 that must not be stored.
  std::vector<int64_t> slots;
  for (int32_t s = 0; s < n_seqs; ++s) {
    for (int32_t p = 0; p < c.context_lens[size_t(s)]; ++p) {
      slots.push_back(int64_t(tables[size_t(s * max_blocks + p / block_size)]) * block_size + p % block_size);
    }
  }
  slots.insert(slots.begin() + 1, -1);
  const int64_t n_tok = int64_t(slots.size());
  const Bf16Data k = kv_rows(rng, n_tok * c.n_kv_heads, c.head_dim);
  const Bf16Data v = kv_rows(rng, n_tok * c.n_kv_heads, c.head_dim);

  // CPU pools (the CPU writer skips nothing: only the rows with a slot go to it).
  const size_t pool_rows = size_t(n_blocks_pool) * block_size * c.n_kv_heads;
  std::vector<uint8_t> k_cpu(pool_rows * size_t(kf.bytes()), 0), v_cpu(pool_rows * size_t(vf.bytes()), 0);
  std::vector<int64_t> cpu_slots;
  std::vector<float> k_rows, v_rows;
  const size_t row_floats = size_t(c.n_kv_heads) * c.head_dim;
  for (int64_t t = 0; t < n_tok; ++t) {
    if (slots[size_t(t)] < 0) continue;
    cpu_slots.push_back(slots[size_t(t)]);
    k_rows.insert(k_rows.end(), k.f.begin() + long(t * row_floats), k.f.begin() + long((t + 1) * row_floats));
    v_rows.insert(v_rows.end(), v.f.begin() + long(t * row_floats), v.f.begin() + long((t + 1) * row_floats));
  }
  cpu::kv_write_rows(pool, kf, c.seed_layer, c.n_kv_heads, k_rows.data(), cpu_slots.data(), int64_t(cpu_slots.size()),
                     k_cpu.data());
  cpu::kv_write_rows(pool, vf, c.seed_layer, c.n_kv_heads, v_rows.data(), cpu_slots.data(), int64_t(cpu_slots.size()),
                     v_cpu.data());

  // GPU pools, written in two launches (a prefix, then the rest) as steps would.
  DeviceBuffer<uint8_t> k_pool(k_cpu.size()), v_pool(v_cpu.size());
  DeviceBuffer<uint16_t> k_x(k.bits.size()), v_x(v.bits.size());
  DeviceBuffer<int64_t> d_slots(slots.size());
  ASSERT_CUDA_OK(cudaMemset(k_pool.p, 0, k_cpu.size()));
  ASSERT_CUDA_OK(cudaMemset(v_pool.p, 0, v_cpu.size()));
  k_x.upload(k.bits);
  v_x.upload(v.bits);
  d_slots.upload(slots);
  const int32_t first = int32_t(n_tok / 3);
  for (int part = 0; part < 2; ++part) {
    const int32_t t0 = part == 0 ? 0 : first, n = part == 0 ? first : int32_t(n_tok) - first;
    launch_kv_codec_write({k_x.p + size_t(t0) * row_floats, d_slots.p + t0, k_pool.p, kl, n, c.n_kv_heads, c.seed_layer},
                          nullptr);
    launch_kv_codec_write({v_x.p + size_t(t0) * row_floats, d_slots.p + t0, v_pool.p, vl, n, c.n_kv_heads, c.seed_layer},
                          nullptr);
  }
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const std::vector<uint8_t> k_gpu = k_pool.download(), v_gpu = v_pool.download();
  const int64_t kd = first_diff(k_gpu, k_cpu), vd = first_diff(v_gpu, v_cpu);
  EXPECT_EQ(kd, -1) << "key bytes differ first at byte " << kd << " (row " << kd / kf.bytes() << ", byte "
                    << kd % kf.bytes() << " of " << kf.bytes() << ")";
  EXPECT_EQ(vd, -1) << "value bytes differ first at byte " << vd << " (row " << vd / vf.bytes() << ", byte "
                    << vd % vf.bytes() << " of " << vf.bytes() << ")";

  // Attention over the GPU-written pools against the reference over the CPU-written ones.
  const Bf16Data q = random_bf16(rng, size_t(n_seqs) * c.n_heads * c.head_dim, 1.0f);
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  std::vector<float> ref(q.f.size());
  for (int32_t s = 0; s < n_seqs; ++s) {
    cpu::KvCodecAttentionArgs ra{};
    ra.q = q.f.data() + size_t(s) * c.n_heads * c.head_dim;
    ra.out = ref.data() + size_t(s) * c.n_heads * c.head_dim;
    ra.k_pool = k_cpu.data();
    ra.v_pool = v_cpu.data();
    ra.k_fmt = kf;
    ra.v_fmt = vf;
    ra.seed_layer = c.seed_layer;
    ra.block_table = tables.data() + size_t(s) * max_blocks;
    ra.block_size = block_size;
    ra.n_q = 1;
    ra.pos0 = c.context_lens[size_t(s)] - 1;
    ra.n_heads = c.n_heads;
    ra.n_kv_heads = c.n_kv_heads;
    ra.scale = scale;
    ra.softcap = c.softcap;
    ra.window = 0;
    reference::paged_attention_codec(ra);
  }
  DeviceBuffer<uint16_t> d_q(q.bits.size()), d_out(q.bits.size());
  DeviceBuffer<int32_t> d_tables(tables.size()), d_lens(c.context_lens.size());
  d_q.upload(q.bits);
  d_tables.upload(tables);
  d_lens.upload(c.context_lens);
  for (int32_t n_splits : c.splits) {
    for (const Variant& var : kVariants) {
      const int32_t min_blocks = var.min_blocks;
      set_kv_codec_attention_mma(var.mma);
      if (var.mma) {
        set_kv_codec_mma_blocks(min_blocks);
      } else {
        set_kv_codec_attention_min_blocks(min_blocks);
      }
      SCOPED_TRACE("n_splits " + std::to_string(n_splits) + ", " + (var.mma ? "tensor-core" : "CUDA-core") +
                   ", min blocks " + std::to_string(min_blocks));
      DeviceBuffer<float> part_out(size_t(n_splits) * q.bits.size()), part_ml(size_t(n_splits) * n_seqs * c.n_heads * 2);
      d_out.poison();
      KvCodecAttentionArgs a{};
      a.q = d_q.p;
      a.out = d_out.p;
      a.k_pool = k_pool.p;
      a.v_pool = v_pool.p;
      a.k_fmt = kl;
      a.v_fmt = vl;
      a.seed_layer = c.seed_layer;
      a.block_tables = d_tables.p;
      a.context_lens = d_lens.p;
      a.partial_out = part_out.p;
      a.partial_ml = part_ml.p;
      a.n_seqs = n_seqs;
      a.n_splits = n_splits;
      a.max_blocks_per_seq = max_blocks;
      a.block_size = block_size;
      a.n_heads = c.n_heads;
      a.n_kv_heads = c.n_kv_heads;
      a.scale = scale;
      a.softcap = c.softcap;
      launch_kv_codec_attention(a, nullptr);
      ASSERT_CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> got = bf16_to_floats(d_out.download());
      const double err = max_norm_rel(got, ref);
      std::printf("%-5s heads %d/%d dim %d group %d splits %d %s min blocks %d softcap %.0f: max-norm rel err %.3e\n",
                  kv_codec_name(c.codec), c.n_heads, c.n_kv_heads, c.head_dim, c.group_size, n_splits,
                  var.mma ? "mma " : "core", min_blocks, double(c.softcap), err);
      EXPECT_LT(err, 1e-2);
    }
  }
  set_kv_codec_attention_min_blocks(3);
  set_kv_codec_mma_blocks(3);
  set_kv_codec_attention_mma(true);
}

TEST(GpuKvCodec, EncodeBytesAndAttentionMatchCpu) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(fresh_seed());
  ThreadPool pool(2);
  for (KvCodec codec : {KvCodec::kBf16, KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo}) {
    // Llama-3.1-8B's head shape (group 4, head dim 128), ragged lengths.
    run_case(rng, pool, {codec, 8, 2, 128, {1, 37, 300, 1029}, {1, 3, 7}});
    // Head dim 64 (one affine group per row part pair), no GQA, a soft-cap.
    run_case(rng, pool, {codec, 4, 4, 64, {16, 200}, {1, 4}, 30.0f, 11});
    // Group 8.
    run_case(rng, pool, {codec, 16, 2, 128, {77, 500}, {2}});
    // One-token blocks: a split spans more block-table entries than a block caches.
    run_case(rng, pool, {codec, 8, 2, 128, {1100, 5}, {1}, 0.0f, 0, 1});
    // Long contexts: many tiles per warp, splits of uneven tile counts.
    run_case(rng, pool, {codec, 32, 8, 128, {4099, 2500}, {3, 16}});
  }
  // Affine groups other than the defaults: int8 values in groups of 32 and turbo keys in groups
  // of 16 (tensor-core kernel), int4 values in groups of 32 (the CUDA-core kernel takes them).
  run_case(rng, pool, {KvCodec::kInt8, 8, 2, 128, {300, 1029}, {1, 3}, 0.0f, 5, 16, 32});
  run_case(rng, pool, {KvCodec::kTurbo, 8, 2, 128, {300, 1029}, {1, 3}, 0.0f, 5, 16, 16});
  run_case(rng, pool, {KvCodec::kInt4, 8, 2, 128, {300, 77}, {2}, 30.0f, 5, 16, 32});
  run_case(rng, pool, {KvCodec::kInt8, 8, 8, 64, {300, 77}, {2}, 0.0f, 5, 16, 16});
}

// Turbo3 values decoded on the CPU equal what the GPU attention sees: with one key the
// attention output is that key's value row, rotated back (checks the inverse rotation and the
// rotation seeds of every KV head).
TEST(GpuKvCodec, TurboSingleKeyIsTheDecodedValue) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  std::mt19937 rng(fresh_seed());
  const int32_t n_kv = 4, hd = 128, n_heads = 8, layer = 17;
  const KvCodecSpec spec{KvCodec::kTurbo, 0};
  const KvRowFormat kf = kv_key_format(spec, hd), vf = kv_value_format(spec, hd);
  const Bf16Data k = kv_rows(rng, n_kv, hd), v = kv_rows(rng, n_kv, hd);
  DeviceBuffer<uint8_t> k_pool(size_t(16 * n_kv * kf.bytes())), v_pool(size_t(16 * n_kv * vf.bytes()));
  DeviceBuffer<uint16_t> k_x(k.bits.size()), v_x(v.bits.size());
  DeviceBuffer<int64_t> d_slot(1);
  k_x.upload(k.bits);
  v_x.upload(v.bits);
  d_slot.upload({0});
  launch_kv_codec_write({k_x.p, d_slot.p, k_pool.p, kv_row_layout(kf), 1, n_kv, layer}, nullptr);
  launch_kv_codec_write({v_x.p, d_slot.p, v_pool.p, kv_row_layout(vf), 1, n_kv, layer}, nullptr);
  const std::vector<uint8_t> v_bytes = v_pool.download();
  std::vector<float> expect(size_t(n_heads) * hd);
  for (int32_t h = 0; h < n_heads; ++h) {
    const int32_t kvh = h / (n_heads / n_kv);
    reference::kv_decode_row(vf, v_bytes.data() + size_t(kvh) * size_t(vf.bytes()), expect.data() + size_t(h) * hd,
                             kv_rotation_seed(layer, kvh));
  }
  const Bf16Data q = random_bf16(rng, size_t(n_heads) * hd, 1.0f);
  DeviceBuffer<uint16_t> d_q(q.bits.size()), d_out(q.bits.size());
  DeviceBuffer<int32_t> d_table(1), d_len(1);
  DeviceBuffer<float> part_out(q.bits.size()), part_ml(size_t(n_heads) * 2);
  d_q.upload(q.bits);
  d_table.upload({0});
  d_len.upload({1});
  KvCodecAttentionArgs a{};
  a.q = d_q.p;
  a.out = d_out.p;
  a.k_pool = k_pool.p;
  a.v_pool = v_pool.p;
  a.k_fmt = kv_row_layout(kf);
  a.v_fmt = kv_row_layout(vf);
  a.seed_layer = layer;
  a.block_tables = d_table.p;
  a.context_lens = d_len.p;
  a.partial_out = part_out.p;
  a.partial_ml = part_ml.p;
  a.n_seqs = 1;
  a.n_splits = 1;
  a.max_blocks_per_seq = 1;
  a.block_size = 16;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv;
  a.scale = 0.1f;
  launch_kv_codec_attention(a, nullptr);
  ASSERT_CUDA_OK(cudaDeviceSynchronize());
  const double err = max_norm_rel(bf16_to_floats(d_out.download()), expect);
  EXPECT_LT(err, 1e-2);
}

TEST(GpuKvCodec, ProblemsAreNamed) {
  const KvRowLayout ok{KvRowKindGpu::kAffine4, 128, 64, 72};
  EXPECT_STREQ(kv_codec_gpu_problem(ok, ok), "");
  EXPECT_STRNE(kv_codec_gpu_problem({KvRowKindGpu::kAffine4, 96, 32, 56}, {KvRowKindGpu::kAffine4, 96, 32, 56}), "");
  EXPECT_STRNE(kv_codec_gpu_problem({KvRowKindGpu::kAffine8, 128, 24, 0}, ok), "");
  EXPECT_STRNE(kv_codec_gpu_problem({KvRowKindGpu::kFp8, 128, 0, 132}, ok), "");  // mixed codecs
  const KvRowFormat turbo_v = kv_value_format({KvCodec::kTurbo, 0}, 128);
  EXPECT_EQ(kv_row_layout(turbo_v).bytes, 52);
  EXPECT_EQ(int32_t(kv_row_layout(turbo_v).kind), int32_t(KvRowKind::kTurbo3));
}

}  // namespace
}  // namespace strata::cuda
