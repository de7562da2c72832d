// Delayed KV quantization at the model level (--kv-quant-start's read path): a sequence whose
// older blocks were converted into a codec storage (convert_kv_block into new block ids) and
// whose newer blocks stay exact is read per block in its own format. Its logits match an exact
// cache holding the dequantized rows of the converted blocks, its old exact blocks are never
// read again, and packing it with another sequence or splitting its steps changes no bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backend/reference/kv_codec.h"
#include "core/thread_pool.h"
#include "golden_cases.h"
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

bool owns_kv(const std::vector<KvLayerSpec>& layout, int32_t layer) {
  return layout[size_t(layer)].has_kv && layout[size_t(layer)].shares_with < 0;
}

SeqSpan span(int32_t n, int32_t pos0, const std::vector<int32_t>& table, int32_t n_quant) {
  SeqSpan s;
  s.n_tokens = n;
  s.pos0 = pos0;
  s.block_table = table;
  s.n_quant_blocks = n_quant;
  s.logits_all = true;
  return s;
}

double max_rel(const float* a, const float* b, size_t n) {
  double d = 0, mag = 1e-30;
  for (size_t i = 0; i < n; ++i) d = std::max(d, std::fabs(double(a[i]) - b[i])), mag = std::max(mag, std::fabs(double(b[i])));
  return d / mag;
}

int32_t argmax(const float* l, int32_t n) {
  int32_t best = 0;
  for (int32_t i = 1; i < n; ++i)
    if (l[i] > l[best]) best = i;
  return best;
}

const KvCodec kCodecs[] = {KvCodec::kBf16, KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo};

class KvQuantModelTest : public ::testing::TestWithParam<const char*> {};

TEST_P(KvQuantModelTest, MixedCacheMatchesDequantizedExactCache) {
  ThreadPool pool(2);
  auto model = load_model(model_dir(GetParam()), pool);
  ASSERT_TRUE(model.ok()) << model.error().to_string();
  Model& m = **model;
  const int32_t V = m.config().vocab_size, bs = 16, quant_start = 32;
  const int32_t n_quant = quant_start / bs;  // full blocks behind quant_start
  const std::vector<int32_t> ids = golden::cases_for(GetParam())[3].prompt_ids;
  const auto layout = m.kv_layout();
  const int32_t n_layers = int32_t(layout.size());
  std::vector<int32_t> table;
  for (int32_t i = 0; i < 12; ++i) table.push_back(i);
  KvStorage exact(layout, 16, bs);
  {
    StepBatch b;
    b.tokens = ids;
    b.seqs = {span(int32_t(ids.size()), 0, table, 0)};
    std::vector<float> l(ids.size() * size_t(V));
    m.forward(b, exact, nullptr, l.data());
  }

  for (KvCodec c : kCodecs) {
    SCOPED_TRACE(kv_codec_name(c));
    KvStorage quant(with_codec(layout, c), 8, bs);
    const std::vector<int32_t> quant_ids = {5, 2};  // new blocks of the codec storage
    // The reference: an exact cache whose first blocks hold the dequantized converted rows.
    KvStorage deq = exact;
    for (int32_t layer = 0; layer < n_layers; ++layer) {
      if (!owns_kv(layout, layer)) continue;
      for (int32_t i = 0; i < n_quant; ++i) {
        convert_kv_block(exact, layer, table[size_t(i)], quant, quant_ids[size_t(i)]);
        convert_kv_block(quant, layer, quant_ids[size_t(i)], deq, table[size_t(i)]);
      }
    }
    // The mixed cache: the same exact storage, its first blocks released (poisoned here, so a
    // read of them would show) and the table pointing at the codec blocks instead.
    KvStorage mixed = exact;
    mixed.set_quant(&quant);
    for (int32_t layer = 0; layer < n_layers; ++layer) {
      if (!owns_kv(layout, layer)) continue;
      const KvLayerSpec& sp = layout[size_t(layer)];
      for (int32_t i = 0; i < n_quant; ++i) {
        const int64_t off = int64_t(table[size_t(i)]) * bs * sp.n_kv_heads;
        std::fill_n(mixed.k_pool(layer) + off * sp.head_dim_k, int64_t(bs) * sp.n_kv_heads * sp.head_dim_k,
                    std::numeric_limits<float>::quiet_NaN());
        std::fill_n(mixed.v_pool(layer) + off * sp.head_dim_v, int64_t(bs) * sp.n_kv_heads * sp.head_dim_v,
                    std::numeric_limits<float>::quiet_NaN());
      }
    }
    std::vector<int32_t> mixed_table = table;
    for (int32_t i = 0; i < n_quant; ++i) mixed_table[size_t(i)] = quant_ids[size_t(i)];
    KvStorage mixed_steps = mixed;   // decoded one token per step
    KvStorage mixed_packed = mixed;  // decoded in one chunk packed with another sequence

    // Greedy decode of 8 tokens over the reference; the mixed cache is fed the same tokens.
    std::vector<int32_t> gen;
    std::vector<float> want, got;
    int32_t pos = int32_t(ids.size());
    int32_t tok = ids.back();
    for (int step = 0; step < 8; ++step, ++pos) {
      StepBatch s;
      s.tokens = {tok};
      s.seqs = {span(1, pos, table, 0)};
      std::vector<float> l(static_cast<size_t>(V));
      m.forward(s, deq, nullptr, l.data());
      want.insert(want.end(), l.begin(), l.end());
      s.seqs = {span(1, pos, mixed_table, n_quant)};
      m.forward(s, mixed_steps, nullptr, l.data());
      got.insert(got.end(), l.begin(), l.end());
      gen.push_back(tok);
      tok = argmax(want.data() + size_t(step) * V, V);
    }
    // Same math as the reference, summed in another order by another kernel.
    const double e = max_rel(got.data(), want.data(), want.size());
    EXPECT_LE(e, 1e-5);
    for (int step = 0; step < 8; ++step)
      EXPECT_EQ(argmax(got.data() + size_t(step) * V, V), argmax(want.data() + size_t(step) * V, V)) << "step " << step;

    // The same tokens as one chunk, packed after another sequence over its own blocks: the
    // mixed sequence's logits equal its step-by-step ones bit for bit.
    StepBatch packed;
    const std::vector<int32_t> other(ids.begin(), ids.begin() + 20);
    packed.tokens = other;
    packed.tokens.insert(packed.tokens.end(), gen.begin(), gen.end());
    packed.seqs = {span(int32_t(other.size()), 0, {12, 13}, 0),
                   span(int32_t(gen.size()), int32_t(ids.size()), mixed_table, n_quant)};
    std::vector<float> l(size_t(packed.n_logit_rows()) * size_t(V));
    m.forward(packed, mixed_packed, nullptr, l.data());
    EXPECT_EQ(0, std::memcmp(l.data() + other.size() * size_t(V), got.data(), got.size() * 4));
  }
}

INSTANTIATE_TEST_SUITE_P(Families, KvQuantModelTest,
                         ::testing::Values("qwen3-tiny", "llama3-tiny", "gemma2-tiny", "gemma3-tiny"));

}  // namespace
}  // namespace strata
