// Models over codec KV pools: with every layer stored in a codec, a sequence prefilled in one
// forward, or in chunks packed with another sequence over scattered blocks and then decoded,
// gives bit-identical logits (the codec kernels reduce in a fixed order); the logits stay near
// the exact cache's; and a cache written exact and converted block by block into a codec
// (convert_kv_block) holds exactly the encoded exact rows.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "golden_cases.h"
#include "backend/reference/kv_codec.h"
#include "model/registry.h"

namespace strata {
namespace {

std::string model_dir(const std::string& name) { return std::string(STRATA_TEST_DATA) + "/reference/models/" + name; }

std::vector<KvLayerSpec> with_codec(std::vector<KvLayerSpec> layout, KvCodec c) {
  for (auto& s : layout) {
    if (!s.has_kv || s.shares_with >= 0) continue;
    s.codec = {c, kv_default_group(c, s.head_dim_k)};
  }
  return layout;
}

SeqSpan span(int32_t n, int32_t pos0, const std::vector<int32_t>& table, bool all) {
  SeqSpan s;
  s.n_tokens = n;
  s.pos0 = pos0;
  s.block_table = table;
  s.logits_all = all;
  s.logits_last = true;
  return s;
}

// Logits of every position of `ids` prefilled in one forward into `kv` over `table`.
std::vector<float> prefill_all(Model& m, KvStorage& kv, const std::vector<int32_t>& ids,
                               const std::vector<int32_t>& table) {
  StepBatch b;
  b.tokens = ids;
  b.seqs = {span(int32_t(ids.size()), 0, table, true)};
  std::vector<float> l(ids.size() * size_t(m.config().vocab_size));
  m.forward(b, kv, nullptr, l.data());
  return l;
}

double max_rel(const float* a, const float* b, size_t n) {
  double d = 0, mag = 1e-30;
  for (size_t i = 0; i < n; ++i) d = std::max(d, std::fabs(double(a[i]) - b[i])), mag = std::max(mag, std::fabs(double(b[i])));
  return d / mag;
}

const KvCodec kCodecs[] = {KvCodec::kBf16, KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo};

class KvCodecModelTest : public ::testing::TestWithParam<const char*> {};

TEST_P(KvCodecModelTest, ChunkedPackedScatteredMatchOneForward) {
  ThreadPool pool(2);
  auto model = load_model(model_dir(GetParam()), pool);
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  Model& m = **model;
  const int32_t V = m.config().vocab_size, bs = 16;
  const auto cases = golden::cases_for(GetParam());
  ASSERT_GE(cases.size(), 4u);
  const std::vector<int32_t>& a = cases[3].prompt_ids;  // 100 ids
  const std::vector<int32_t>& b = cases[2].prompt_ids;
  std::vector<int32_t> contiguous;
  for (int i = 0; i < 8; ++i) contiguous.push_back(i);
  KvStorage exact_kv(m.kv_layout(), 8, bs);
  const std::vector<float> exact = prefill_all(m, exact_kv, a, contiguous);

  std::vector<double> err;  // max-norm relative logit error against the exact cache, per codec
  for (KvCodec c : kCodecs) {
    SCOPED_TRACE(kv_codec_name(c));
    const auto layout = with_codec(m.kv_layout(), c);
    KvStorage alone_kv(layout, 8, bs);
    const std::vector<float> ref = prefill_all(m, alone_kv, a, contiguous);
    // Not a copy of the exact cache, and not garbage.
    err.push_back(max_rel(ref.data(), exact.data(), ref.size()));
    EXPECT_GT(err.back(), 0.0);
    EXPECT_TRUE(std::isfinite(err.back()));

    KvStorage kv(layout, 32, bs);
    std::vector<int32_t> table_a, table_b;
    for (int i = 0; i < 8; ++i) table_a.push_back(31 - 2 * i);
    for (int i = 0; i < 4; ++i) table_b.push_back(2 * i);
    StepBatch s1;
    s1.tokens.assign(a.begin(), a.begin() + 40);
    s1.tokens.insert(s1.tokens.end(), b.begin(), b.end());
    s1.seqs = {span(40, 0, table_a, true), span(int32_t(b.size()), 0, table_b, false)};
    std::vector<float> l1(size_t(s1.n_logit_rows()) * size_t(V));
    m.forward(s1, kv, nullptr, l1.data());
    for (int t = 0; t < 40; ++t)
      ASSERT_EQ(0, std::memcmp(&l1[size_t(t) * V], &ref[size_t(t) * V], size_t(V) * 4)) << "position " << t;
    // The rest of a: a chunk, then single decode steps.
    int32_t pos = 40;
    while (pos < int32_t(a.size())) {
      const int32_t n = pos < 90 ? 50 : 1;
      StepBatch s;
      s.tokens.assign(a.begin() + pos, a.begin() + pos + n);
      s.seqs = {span(n, pos, table_a, true)};
      std::vector<float> l(size_t(n) * size_t(V));
      m.forward(s, kv, nullptr, l.data());
      for (int t = 0; t < n; ++t)
        ASSERT_EQ(0, std::memcmp(&l[size_t(t) * V], &ref[size_t(pos + t) * V], size_t(V) * 4)) << "position " << pos + t;
      pos += n;
    }
  }
  // More bits, less error: bf16 < int8 < int4 (kCodecs order: bf16, fp8, int8, int4, turbo).
  EXPECT_LT(err[0], err[2]);
  EXPECT_LT(err[2], err[3]);
}

// --kv-quant-start's step: a cache written exact is converted block by block, one layer at a
// time, into codec pools. Every converted row equals the exact row encoded, and a decode step
// over the converted cache stays near the same step over the exact cache.
TEST_P(KvCodecModelTest, ConvertedBlocksHoldTheEncodedExactRows) {
  ThreadPool pool(2);
  auto model = load_model(model_dir(GetParam()), pool);
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  Model& m = **model;
  const int32_t V = m.config().vocab_size, bs = 16;
  const std::vector<int32_t> ids = golden::cases_for(GetParam())[3].prompt_ids;
  const int32_t used = (int32_t(ids.size()) + bs - 1) / bs;
  std::vector<int32_t> table;
  for (int i = 0; i < 8; ++i) table.push_back(i);
  KvStorage exact(m.kv_layout(), 8, bs);
  prefill_all(m, exact, ids, table);
  auto decode = [&](KvStorage& kv) {
    KvStorage copy = kv;  // the step writes the new token; keep the source as it was
    StepBatch s;
    s.tokens = {ids[5]};
    s.seqs = {span(1, int32_t(ids.size()), table, false)};
    std::vector<float> l(static_cast<size_t>(V));
    m.forward(s, copy, nullptr, l.data());
    return l;
  };
  const std::vector<float> exact_step = decode(exact);
  for (KvCodec c : kCodecs) {
    SCOPED_TRACE(kv_codec_name(c));
    const auto layout = with_codec(m.kv_layout(), c);
    KvStorage converted(layout, 8, bs);
    // Into other block ids than the source's, as the engine would allocate them.
    std::vector<int32_t> moved;
    for (int32_t blk = 0; blk < 8; ++blk) moved.push_back(7 - blk);
    for (int32_t layer = 0; layer < int32_t(layout.size()); ++layer) {
      if (!layout[size_t(layer)].has_kv || layout[size_t(layer)].shares_with >= 0) continue;
      for (int32_t blk = 0; blk < used; ++blk) convert_kv_block(exact, layer, blk, converted, moved[size_t(blk)]);
      const KvLayerSpec& sp = layout[size_t(layer)];
      const KvRowFormat kf = converted.k_format(layer), vf = converted.v_format(layer);
      std::vector<uint8_t> want(size_t(std::max(kf.bytes(), vf.bytes())));
      for (int32_t p = 0; p < int32_t(ids.size()); ++p) {
        const int64_t src_slot = int64_t(p / bs) * bs + p % bs;
        const int64_t dst_slot = int64_t(moved[size_t(p / bs)]) * bs + p % bs;
        for (int32_t h = 0; h < sp.n_kv_heads; ++h) {
          const uint64_t seed = kv_rotation_seed(layer, h);
          const int64_t sr = src_slot * sp.n_kv_heads + h, dr = dst_slot * sp.n_kv_heads + h;
          reference::kv_encode_row(kf, exact.k_pool(layer) + sr * sp.head_dim_k, want.data(), seed);
          ASSERT_EQ(0, std::memcmp(want.data(), converted.k_rows(layer) + dr * kf.bytes(), size_t(kf.bytes())))
              << "layer " << layer << " position " << p << " head " << h;
          reference::kv_encode_row(vf, exact.v_pool(layer) + sr * sp.head_dim_v, want.data(), seed);
          ASSERT_EQ(0, std::memcmp(want.data(), converted.v_rows(layer) + dr * vf.bytes(), size_t(vf.bytes())))
              << "layer " << layer << " position " << p << " head " << h;
        }
      }
    }
    table = moved;
    const std::vector<float> step = decode(converted);
    table.assign(moved.rbegin(), moved.rend());
    const double e = max_rel(step.data(), exact_step.data(), step.size());
    EXPECT_GT(e, 0.0);
    EXPECT_TRUE(std::isfinite(e));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, KvCodecModelTest,
                         ::testing::Values("qwen3-tiny", "llama3-tiny", "gemma2-tiny", "gemma3-tiny"));

}  // namespace
}  // namespace strata
