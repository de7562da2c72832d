// Shared by the GPU KV-codec model tests: the codec configs they run (each codec for every
// layer, and a per-layer mix), per-layer specs as the engine resolves them, random prompts, and
// the greedy-id helpers of their oracle rule.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "gpu_test_util.h"
#include "kv/codec/kv_codec_config.h"
#include "model/kv_storage.h"
#include "model/model.h"
#include "model/model_config.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/cuda_model.h"

namespace strata::gpu_test {

struct CodecCase {
  const char* name;
  KvCodecConfig config;
};

// fp8, int8, int4 and turbo in every layer, and --kv-config's mix of three codecs (the tiny
// models have 3 layers).
inline std::vector<CodecCase> codec_cases() {
  std::vector<CodecCase> out;
  for (KvCodec c : {KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo}) {
    KvCodecConfig k;
    k.default_spec.codec = c;
    out.push_back({kv_codec_name(c), k});
  }
  KvCodecConfig mix;
  mix.default_spec.codec = KvCodec::kInt8;
  mix.layers = {{0, {KvCodec::kBf16, 0}}, {2, {KvCodec::kTurbo, 0}}};
  out.push_back({"mixed bf16/int8/turbo", mix});
  return out;
}

// Per-layer specs as the engine resolves them for a model whose layers all own their KV.
inline std::vector<KvCodecSpec> layer_specs(const ModelConfig& cfg, const KvCodecConfig& c) {
  std::vector<KvCodecLayerDims> dims(size_t(cfg.n_layers));
  for (auto& d : dims) d.head_dim_k = d.head_dim_v = cfg.head_dim;
  auto r = resolve_kv_codecs(cuda::cuda_kv_codecs(c, false), dims);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return r.ok() ? *r : std::vector<KvCodecSpec>{};
}

// Per-layer specs as the engine resolves them for this model's KV layout (linear-attention
// layers keep no KV, shared layers read their source's).
inline std::vector<KvCodecSpec> model_layer_specs(const Model& m, const KvCodecConfig& c) {
  const std::vector<KvLayerSpec> layout = m.kv_layout();
  std::vector<KvCodecLayerDims> dims(layout.size());
  for (size_t l = 0; l < layout.size(); ++l) dims[l] = {layout[l].has_kv, layout[l].shares_with, layout[l].head_dim_k, layout[l].head_dim_v};
  auto r = resolve_kv_codecs(cuda::cuda_kv_codecs(c, false), dims);
  EXPECT_TRUE(r.ok()) << (r.ok() ? "" : r.error().to_string());
  return r.ok() ? *r : std::vector<KvCodecSpec>{};
}

inline std::vector<int32_t> prompt_ids(int32_t vocab, int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = int32_t(rng() % uint32_t(vocab));
  return ids;
}

inline int32_t argmax_of(const float* row, int32_t vocab) { return int32_t(std::max_element(row, row + vocab) - row); }

// Whether the top two of row are within tol * max|row| of each other (a near tie).
inline bool near_tie(const float* row, int32_t vocab, double tol) {
  float a = -INFINITY, b = -INFINITY, amax = 0.0f;
  for (int32_t i = 0; i < vocab; ++i) {
    amax = std::max(amax, std::fabs(row[i]));
    if (row[i] > a) {
      b = a;
      a = row[i];
    } else if (row[i] > b) {
      b = row[i];
    }
  }
  return double(a - b) <= tol * double(amax);
}

// The codec rule of these tests, row by row: the GPU's logits within 2e-2 + e of the CPU codec
// run's, e = that run's own error against exact KV on the same ids (the two codec runs may
// round a value to neighbouring levels, so they differ by up to about the codec's own error);
// the greedy id the CPU codec run's where its top two are not a near tie within that tolerance.
struct CodecRowRule {
  double worst = 0, worst_exact = 0, worst_codec = 0, worst_ratio = 0;
  int32_t same_ids = 0, counted = 0;

  // floor: added to the bound (the GPU's error with bf16 exact KV on the row, where the model's
  // codec rows are that sensitive to their inputs: Gemma 3/4, gpu_kv_codec_model_test's rule).
  void check(int32_t row, const std::vector<float>& got, int32_t got_id, const std::vector<float>& ref, int32_t ref_id,
             const std::vector<float>& exact, double floor = 0.0) {
    const double e = max_norm_rel(ref, exact);
    const double err = max_norm_rel(got, ref);
    worst = std::max(worst, err);
    worst_exact = std::max(worst_exact, max_norm_rel(got, exact));
    worst_codec = std::max(worst_codec, e);
    worst_ratio = std::max(worst_ratio, err / std::max(e, 1e-9));
    const double tol = 2e-2 + e + floor;
    EXPECT_LE(err, tol) << "row " << row << " (codec error on the CPU " << e << ")";
    if (!near_tie(ref.data(), int32_t(ref.size()), tol)) {
      ++counted;
      same_ids += got_id == ref_id ? 1 : 0;
      EXPECT_EQ(got_id, ref_id) << "greedy id at row " << row;
    }
  }
};

// One sequence whose blocks 0..15 hold its KV, its last row the logit row; state slot 0 when the
// model keeps recurrent state.
inline SeqSpan one_sequence(int32_t pos0, int32_t n_tokens, bool state) {
  SeqSpan s;
  for (int32_t b = 0; b < 16; ++b) s.block_table.push_back(b);
  s.pos0 = pos0;
  s.n_tokens = n_tokens;
  s.logits_last = true;
  s.state_slot = state ? 0 : -1;
  return s;
}

inline bool has_state(const Model& m) {
  for (const auto& s : m.state_layout()) {
    if (s.has_state) return true;
  }
  return false;
}

// CPU forward of one sequence (prefill of `prompt`, then `steps` greedy steps), exact KV (no
// specs) or each layer's codec: the last prompt logits and each step's, the greedy ids, and the
// KV rows the run left.
struct CpuRun {
  std::vector<std::vector<float>> logits;  // [1 + steps][vocab]
  std::vector<int32_t> ids;                // [1 + steps] argmax of each row
  std::unique_ptr<KvStorage> kv;
};

// forced: feed these ids after the prompt instead of the argmax of each row.
inline CpuRun cpu_greedy(Model& m, const std::vector<KvCodecSpec>& specs, const std::vector<int32_t>& prompt, int32_t steps,
                         const std::vector<int32_t>* forced = nullptr) {
  std::vector<KvLayerSpec> layout = m.kv_layout();
  for (size_t l = 0; l < layout.size() && l < specs.size(); ++l) layout[l].codec = specs[l];
  CpuRun r;
  r.kv = std::make_unique<KvStorage>(layout, 16, 16);
  const bool state = has_state(m);
  std::unique_ptr<StateStorage> states = state ? std::make_unique<StateStorage>(m.state_layout(), 1) : nullptr;
  const int32_t vocab = m.config().vocab_size;
  StepBatch b;
  b.tokens = prompt;
  b.seqs = {one_sequence(0, int32_t(prompt.size()), state)};
  for (int32_t s = 0; s <= steps; ++s) {
    std::vector<float> row(static_cast<size_t>(vocab));
    m.forward(b, *r.kv, states.get(), row.data());
    r.ids.push_back(argmax_of(row.data(), vocab));
    r.logits.push_back(std::move(row));
    b.seqs[0].pos0 += b.seqs[0].n_tokens;
    b.seqs[0].n_tokens = 1;
    b.tokens = {forced != nullptr ? (*forced)[size_t(s)] : r.ids.back()};
  }
  return r;
}

// The GPU decoder on the prompt, then one token a step teacher-forced on ref's ids (so every
// row stays comparable): each row under CodecRowRule against ref and exact, and the decoder's
// greedy token the argmax of its own logits.
inline CodecRowRule check_decoder_rows(cuda::CudaDecoder& m, const std::vector<int32_t>& prompt, const CpuRun& ref,
                                       const CpuRun& exact, bool state) {
  const int32_t vocab = m.config().vocab_size;
  CodecRowRule rule;
  StepBatch b;
  b.tokens = prompt;
  b.seqs = {one_sequence(0, int32_t(prompt.size()), state)};
  std::vector<float> got(static_cast<size_t>(vocab));
  for (size_t s = 0; s < ref.ids.size(); ++s) {
    int32_t am = -1;
    EXPECT_TRUE(m.forward(b, &am, got.data()).ok());
    EXPECT_EQ(am, argmax_of(got.data(), vocab));
    rule.check(int32_t(s), got, am, ref.logits[s], ref.ids[s], exact.logits[s]);
    b.seqs[0].pos0 += b.seqs[0].n_tokens;
    b.seqs[0].n_tokens = 1;
    b.tokens = {ref.ids[s]};
  }
  return rule;
}

}  // namespace strata::gpu_test
