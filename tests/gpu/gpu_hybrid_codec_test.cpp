// KV codecs for the gated-DeltaNet hybrids (qwen3next-tiny, qwen35-tiny, qwen35moe-tiny) on the
// GPU: their pool holds the full-attention layers only, and those go through KvCodecStep.
//  - geometry: one entry per full-attention layer, keeping its model layer (the turbo seed);
//    check_cuda_engine_support takes codecs for hybrids, --kv-config naming a linear-attention
//    layer is an error as on the CPU, an explicit --kv-quant-start N is taken and auto is 0;
//  - the decoder's logits on a 37-token prompt and 8 greedy steps against the CPU model's
//    forward with the same codec in the same layers (both over the same bf16-rounded weights),
//    by the rule of gpu_kv_codec_model_test: within 2e-2 + e per row (e = the CPU codec's own
//    error against exact KV on the same ids), greedy ids equal off near ties;
//  - turbo: the GPU's codec rows of the prompt's first block, decoded with the model layer's
//    rotation, agree with the CPU's rows; decoded with pool layer 0's rotation they do not (the
//    GPU writes the CPU's rotation);
//  - the engine (make_cuda_engine_parts with a codec, deterministic): a greedy request, then the
//    same request again (a prefix hit restoring a state snapshot) give the decoder's own greedy
//    ids for that codec.
// Needs a GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "../support/stream_test_support.h"
#include "engine/engine.h"
#include "gpu_codec_cases.h"
#include "gpu_oracle.h"
#include "gpu_test_util.h"
#include "kv/codec/kv_codec_config.h"
#include "model/kv_storage.h"
#include "model/registry.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/cuda_kv_codec_step.h"
#include "runtime/cuda/cuda_model.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;
using test::drain;
using test::greedy_request;
using test::Outcome;
using test::random_ids;

constexpr const char* kHybrids[] = {"qwen3next-tiny", "qwen35-tiny", "qwen35moe-tiny"};

CudaModelOptions test_options(const std::vector<KvCodecSpec>& specs, bool deterministic = false) {
  CudaModelOptions o;
  o.kv_cache_bytes = int64_t(16) << 20;
  o.block_size = 16;
  o.max_tokens = 256;
  o.max_seqs = 8;
  o.max_blocks_per_seq = 16;
  o.max_logit_rows = 128;
  o.kv_codecs = specs;
  o.deterministic = deterministic;
  return o;
}


std::vector<CodecCase> hybrid_codec_cases() {
  std::vector<CodecCase> out;
  for (const CodecCase& c : codec_cases()) {
    if (c.config.layers.empty()) out.push_back(c);  // the mix names layers 0 and 2: linear here
  }
  return out;
}

TEST(GpuHybridCodecSupport, GeometryAndFlags) {
  for (const char* name : kHybrids) {
    SCOPED_TRACE(name);
    auto cfg = load_model_config(model_path(name));
    ASSERT_TRUE(cfg.ok()) << cfg.error().to_string();
    auto g = KvCodecStep::geometry(*cfg);
    ASSERT_TRUE(g.ok()) << g.error().to_string();
    std::vector<int32_t> attn;
    for (int l = 0; l < cfg->n_layers; ++l)
      if (cfg->layer_types[size_t(l)] == "full_attention") attn.push_back(l);
    ASSERT_EQ(g->size(), attn.size());
    for (size_t p = 0; p < attn.size(); ++p) {
      EXPECT_EQ((*g)[p].model_layer, attn[p]);
      EXPECT_EQ((*g)[p].kv_layer, int32_t(p));
      EXPECT_EQ((*g)[p].n_heads, cfg->n_heads);
      EXPECT_EQ((*g)[p].n_kv_heads, cfg->n_kv_heads);
      EXPECT_EQ((*g)[p].head_dim, cfg->head_dim);
      EXPECT_EQ((*g)[p].window, 0);
    }
    for (const CodecCase& cc : hybrid_codec_cases()) {
      const Status s = check_cuda_engine_support(*cfg, cc.config);
      EXPECT_TRUE(s.ok()) << cc.name << ": " << s.error().to_string();
    }
    KvCodecConfig linear;
    linear.default_spec.codec = KvCodec::kInt8;
    linear.layers = {{0, {KvCodec::kFp8, 0}}};
    Status s = check_cuda_engine_support(*cfg, linear);
    ASSERT_FALSE(s.ok()) << "--kv-config on a linear-attention layer";
    EXPECT_NE(s.error().message.find("layer_idx 0"), std::string::npos) << s.error().message;
    KvCodecConfig named;
    named.default_spec.codec = KvCodec::kInt8;
    named.layers = {{attn.back(), {KvCodec::kTurbo, 0}}};
    EXPECT_TRUE(check_cuda_engine_support(*cfg, named).ok());
    KvCodecConfig quant;
    quant.default_spec.codec = KvCodec::kFp8;
    quant.quant_start = 16;
    const Status qs = check_cuda_engine_support(*cfg, quant);
    EXPECT_TRUE(qs.ok()) << "--kv-quant-start on a hybrid converts its attention layers: " << qs.error().to_string();
    quant.quant_start = KvCodecConfig::kQuantStartAuto;
    auto q = cuda_kv_quant_start(*cfg, quant, 16, false);
    ASSERT_TRUE(q.ok());
    EXPECT_EQ(*q, 0);
  }
}

// Max |a - b| over max |b| of rows decoded from GPU and CPU bytes (n rows of format f), the GPU's
// decoded with gpu_seed_layer's rotation and the CPU's with cpu_seed_layer's.
double decoded_rows_error(const KvRowFormat& f, const uint8_t* gpu, const uint8_t* cpu, int64_t n_rows, int32_t n_kv_heads,
                          int32_t gpu_seed_layer, int32_t cpu_seed_layer) {
  std::vector<float> a(size_t(f.dim)), b(size_t(f.dim));
  double diff = 0.0, scale = 0.0;
  for (int64_t r = 0; r < n_rows; ++r) {
    const int32_t h = int32_t(r % n_kv_heads);
    reference::kv_decode_row(f, gpu + r * f.bytes(), a.data(), kv_rotation_seed(gpu_seed_layer, h));
    reference::kv_decode_row(f, cpu + r * f.bytes(), b.data(), kv_rotation_seed(cpu_seed_layer, h));
    for (int32_t d = 0; d < f.dim; ++d) {
      diff = std::max(diff, double(std::fabs(a[size_t(d)] - b[size_t(d)])));
      scale = std::max(scale, double(std::fabs(b[size_t(d)])));
    }
  }
  return diff / std::max(scale, 1e-30);
}

class GpuHybridCodec : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuHybridCodec, LogitsAndGreedyIdsMatchTheCpuCodec) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string name = GetParam();
  const std::filesystem::path copy =
      std::filesystem::temp_directory_path() / ("strata_hybrid_codec_" + name + "_" + std::to_string(::getpid()));
  write_bf16_rounded_copy(model_path(name), copy);
  ThreadPool pool(2);
  auto cpu = load_model(copy.string(), pool);
  ASSERT_TRUE(cpu.ok()) << cpu.error().to_string();
  const ModelConfig& cfg = (*cpu)->config();
  const int32_t vocab = cfg.vocab_size;
  const std::vector<KvLayerSpec> layout = (*cpu)->kv_layout();
  int32_t n_attn = 0, last_attn = -1;
  for (size_t l = 0; l < layout.size(); ++l) {
    if (!layout[l].has_kv) continue;
    ++n_attn;
    last_attn = int32_t(l);
  }
  ASSERT_GT(n_attn, 0);
  constexpr int32_t kSteps = 8;
  const std::vector<int32_t> prompt = prompt_ids(vocab, 37, 1234);
  int32_t compared_ids = 0;
  for (const CodecCase& cc : hybrid_codec_cases()) {
    SCOPED_TRACE(cc.name);
    const std::vector<KvCodecSpec> specs = model_layer_specs(**cpu, cc.config);
    ASSERT_EQ(int64_t(specs.size()), int64_t(cfg.n_layers));
    const CpuRun ref = cpu_greedy(**cpu, specs, prompt, kSteps);
    const CpuRun exact = cpu_greedy(**cpu, {}, prompt, kSteps, &ref.ids);
    auto gpu = CudaDecoder::load(copy.string(), test_options(specs));
    ASSERT_TRUE(gpu.ok()) << gpu.error().to_string();
    CudaDecoder& m = **gpu;
    // The pool: the attention layers' codec rows only.
    EXPECT_LT(m.kv_block_bytes(), int64_t(n_attn) * 2 * 16 * cfg.n_kv_heads * cfg.head_dim * 2) << "codec rows, not bf16";
    const CodecRowRule rule = check_decoder_rows(m, prompt, ref, exact, true);
    std::printf("%s %-6s worst over 9 rows: codec error on the CPU %.3e; GPU codec vs CPU codec %.3e, vs exact %.3e; "
                "greedy ids: %d of %d compared equal (%d near ties)\n",
                name.c_str(), cc.name, rule.worst_codec, rule.worst, rule.worst_exact, rule.same_ids, rule.counted,
                kSteps + 1 - rule.counted);
    compared_ids += rule.counted;
    if (cc.config.default_spec.codec == KvCodec::kTurbo) {
      // Block 0 of the last attention layer (the last pool layer): K then V parts of each pool
      // layer in order (CudaDecoder::read_kv_block).
      std::vector<uint8_t> block(size_t(m.kv_block_bytes()));
      ASSERT_TRUE(m.read_kv_block(0, block.data()).ok());
      const KvRowFormat kf = ref.kv->k_format(last_attn), vf = ref.kv->v_format(last_attn);
      const int64_t rows = int64_t(16) * cfg.n_kv_heads;
      const int64_t k_bytes = rows * kf.bytes(), v_bytes = rows * vf.bytes();
      ASSERT_EQ(int64_t(block.size()), int64_t(n_attn) * (k_bytes + v_bytes));
      const uint8_t* gk = block.data() + int64_t(n_attn - 1) * (k_bytes + v_bytes);
      const uint8_t* gv = gk + k_bytes;
      const double k_right = decoded_rows_error(kf, gk, ref.kv->k_rows(last_attn), rows, cfg.n_kv_heads, last_attn, last_attn);
      const double v_right = decoded_rows_error(vf, gv, ref.kv->v_rows(last_attn), rows, cfg.n_kv_heads, last_attn, last_attn);
      const double v_wrong = decoded_rows_error(vf, gv, ref.kv->v_rows(last_attn), rows, cfg.n_kv_heads, n_attn - 1, last_attn);
      std::printf("%s turbo rows of layer %d (pool layer %d), block 0, GPU vs CPU decoded: K %.3e, V %.3e; V decoded with "
                  "pool layer %d's rotation %.3e\n",
                  name.c_str(), last_attn, n_attn - 1, k_right, v_right, n_attn - 1, v_wrong);
      EXPECT_LE(k_right, 0.25);
      EXPECT_LE(v_right, 0.25);
      if (n_attn - 1 != last_attn) {
        EXPECT_GT(v_wrong, 4 * v_right) << "the GPU's rotation is the model layer's";
      }
    }
  }
  EXPECT_GE(compared_ids, 8) << "too many near ties: the test compared too few greedy ids";
  std::filesystem::remove_all(copy);
}

// The decoder alone, deterministic: prefill in one step, then one greedy token per step.
std::vector<int32_t> decoder_greedy(const std::string& dir, const std::vector<KvCodecSpec>& specs, const std::vector<int32_t>& prompt,
                                    int32_t n) {
  std::vector<int32_t> out;
  auto gpu = CudaDecoder::load(dir, test_options(specs, true));
  EXPECT_TRUE(gpu.ok()) << (gpu.ok() ? "" : gpu.error().to_string());
  if (!gpu.ok()) return out;
  StepBatch b;
  b.tokens = prompt;
  b.seqs = {one_sequence(0, int32_t(prompt.size()), true)};
  for (int32_t i = 0; i < n; ++i) {
    int32_t am = -1;
    EXPECT_TRUE((*gpu)->forward(b, &am).ok());
    out.push_back(am);
    b.seqs[0].pos0 += b.seqs[0].n_tokens;
    b.seqs[0].n_tokens = 1;
    b.tokens = {am};
  }
  return out;
}

TEST_P(GpuHybridCodec, EngineGreedyAndPrefixHitGiveTheDecodersIds) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string name = GetParam();
  ThreadPool pool(2);
  auto cpu = load_model(model_path(name), pool);
  ASSERT_TRUE(cpu.ok()) << cpu.error().to_string();
  const int32_t vocab = (*cpu)->config().vocab_size;
  const std::vector<int32_t> prompt = random_ids(7, 100, vocab);
  constexpr int32_t kTokens = 16;
  for (KvCodec codec : {KvCodec::kInt8, KvCodec::kTurbo}) {
    SCOPED_TRACE(kv_codec_name(codec));
    KvCodecConfig config;
    config.default_spec.codec = codec;
    const std::vector<int32_t> want = decoder_greedy(model_path(name), model_layer_specs(**cpu, config), prompt, kTokens);
    ASSERT_EQ(int32_t(want.size()), kTokens);
    CudaEngineOptions d;
    d.kv_cache_bytes = int64_t(16) << 20;
    d.block_size = 16;
    d.max_batch_tokens = 128;
    d.max_num_seqs = 8;
    d.max_model_len = 256;
    d.deterministic = true;
    d.kv_codecs = config;
    auto parts = make_cuda_engine_parts(model_path(name), d);
    ASSERT_TRUE(parts.ok()) << parts.error().to_string();
    EngineOptions eo;
    eo.block_size = 16;
    eo.max_batch_tokens = 128;
    eo.max_num_seqs = 8;
    eo.max_model_len = 256;
    eo.max_queued = 64;
    eo.kv_codecs = parts->kv_codecs;
    eo.model_identity = name;
    eo.prefix_caching = true;
    eo.state_snapshot_interval = 64;
    auto e = Engine::create(std::move(parts->shape), eo, std::move(parts->executor));
    ASSERT_TRUE(e.ok()) << e.error().to_string();
    Engine& engine = **e;
    engine.start();
    const Outcome cold = drain(**engine.submit(greedy_request("cold", prompt, kTokens)));
    const Outcome hit = drain(**engine.submit(greedy_request("hit", prompt, kTokens)));
    const EngineStats st = engine.stats();
    engine.shutdown();
    EXPECT_EQ(cold.tokens, want) << "the engine's greedy ids are the decoder's";
    EXPECT_EQ(hit.tokens, want) << "after a prefix hit too";
    EXPECT_GT(st.prefix_hit_tokens, 0) << "the second request restores the first one's blocks and state";
  }
}

INSTANTIATE_TEST_SUITE_P(Hybrids, GpuHybridCodec, ::testing::ValuesIn(kHybrids),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace strata::cuda
