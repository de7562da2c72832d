// KV codecs in the CUDA decoder (CudaModelOptions::kv_codecs, cuda_kv_codec_step.h) on whole
// models, against the CPU engine's forward with the same codec (the CPU codec attention is the
// reference):
//  - llama3-tiny (head dim 16) and qwen3-tiny (head dim 32, q/k norms) with fp8, int8, int4,
//    turbo and a per-layer mix; both forwards read the same bf16-rounded weights; the prompt row
//    and 8 greedy steps (teacher-forced on the CPU codec run's ids). Per row, with e = the
//    codec's own error on the CPU (codec logits against exact-f32-KV logits on the same ids):
//    GPU codec vs CPU codec within 2e-2 + e (printed too: the GPU codec against exact KV). The
//    GPU encodes K/V rounded to bf16, the CPU from f32, so a value near a quantization boundary
//    can land one level apart: the two codec runs differ by up to about the codec's own error,
//    not by the bf16 floor alone. The greedy ids of all 9 rows are the CPU's where its top two
//    are not a near tie within that tolerance (at least 10 compared over a model's codecs: the
//    coarse codecs leave few rows of these tiny models outside their tolerance);
//  - gemma3-tiny (sliding windows of 16 keys) and gemma4-tiny (windows, KV shared by the last
//    layers) on a 37-token prompt, past the windows: the default f32 rows of the f32
//    checkpoint against the CPU's exact f32 KV within 1e-2 (a bf16 KV cache alone is 3e-2 to
//    1e-1 off on these models); every codec within 2e-2 + e + b, b = the row's error of the
//    GPU's bf16 attention (explicit bf16 rows, bf16 q) against the CPU's exact KV: the codec
//    kernels read q in bf16, which these models amplify past the codec's own error e;
//  - prefill against decode: a prompt prefilled in one step and the same prompt fed in a chunk
//    and then one token per step, in steps shared with another sequence's prefill chunks
//    (mixed steps): on the tiny models within 2e-2 (and the same argmax off near ties); on a
//    random head-dim-128 model (the tensor-core codec kernel) within 2e-2 + its codec error
//    (against the bf16 decoder of the same weights), and bit for bit with
//    CudaModelOptions::deterministic (batch-invariant GEMMs and one key split: a row's
//    attention does not depend on what else the step holds);
//  - codec blocks copied through CudaExecutor (read_blocks / write_blocks and read_block /
//    write_block) into other blocks give bit-identical logits when a sequence reads them.
// Needs a GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/engine.h"
#include "gpu_codec_cases.h"
#include "gpu_oracle.h"
#include "gpu_test_util.h"
#include "kv/codec/kv_codec_config.h"
#include "model/kv_storage.h"
#include "model/registry.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/cuda_model.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

CudaModelOptions test_options(const std::vector<KvCodecSpec>& specs) {
  CudaModelOptions o;
  o.kv_cache_bytes = int64_t(16) << 20;
  o.block_size = 16;
  o.max_tokens = 256;
  o.max_seqs = 8;
  o.max_blocks_per_seq = 16;
  o.max_logit_rows = 128;
  o.kv_codecs = specs;
  return o;
}

SeqSpan span_at(int32_t first_block, int32_t pos0, int32_t n_tokens, bool all) {
  SeqSpan s;
  for (int32_t b = 0; b < 16; ++b) s.block_table.push_back(first_block + b);
  s.pos0 = pos0;
  s.n_tokens = n_tokens;
  s.logits_all = all;
  s.logits_last = !all;
  return s;
}

class GpuKvCodecModel : public ::testing::TestWithParam<const char*> {};

TEST_P(GpuKvCodecModel, LogitsAndGreedyIdsMatchTheCpuCodec) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  const std::string name = GetParam();
  const std::filesystem::path copy =
      std::filesystem::temp_directory_path() / ("strata_codec_bf16_" + name + "_" + std::to_string(::getpid()));
  write_bf16_rounded_copy(model_path(name), copy);
  ThreadPool pool(2);
  auto cpu = load_model(copy.string(), pool);
  ASSERT_TRUE(cpu.ok()) << cpu.error().to_string();
  const ModelConfig& cfg = (*cpu)->config();
  const int32_t vocab = cfg.vocab_size;
  constexpr int32_t kSteps = 8;
  const std::vector<int32_t> prompt = prompt_ids(vocab, 37, 1234);
  int32_t compared_ids = 0;
  for (const CodecCase& cc : codec_cases()) {
    SCOPED_TRACE(cc.name);
    const std::vector<KvCodecSpec> specs = layer_specs(cfg, cc.config);
    const CpuRun ref = cpu_greedy(**cpu, specs, prompt, kSteps);
    const CpuRun exact = cpu_greedy(**cpu, {}, prompt, kSteps, &ref.ids);
    auto gpu = CudaDecoder::load(copy.string(), test_options(specs));
    ASSERT_TRUE(gpu.ok()) << gpu.error().to_string();
    CudaDecoder& m = **gpu;
    EXPECT_LT(m.kv_block_bytes(), int64_t(cfg.n_layers) * 2 * 16 * cfg.n_kv_heads * cfg.head_dim * 2 + 1)
        << "codec blocks are no larger than bf16 blocks";
    const CodecRowRule rule = check_decoder_rows(m, prompt, ref, exact, false);
    std::printf("%s %-22s worst over 9 rows: codec error on the CPU %.3e; GPU codec vs CPU codec %.3e (largest ratio "
                "to the row's codec error %.2f), vs exact %.3e; greedy ids: %d of %d compared equal (%d near ties)\n",
                name.c_str(), cc.name, rule.worst_codec, rule.worst, rule.worst_ratio, rule.worst_exact, rule.same_ids,
                rule.counted, kSteps + 1 - rule.counted);
    compared_ids += rule.counted;
  }
  EXPECT_GE(compared_ids, 10) << "too many near ties: the test compared too few greedy ids";
  std::filesystem::remove_all(copy);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuKvCodecModel, ::testing::Values("llama3-tiny", "qwen3-tiny"));

// GPU rows of `specs` (empty: the default, f32 rows for this f32 checkpoint) on the prompt and
// the steps forced to `ids`: the logits of each row.
std::vector<std::vector<float>> gpu_forced(const std::string& dir, const std::vector<KvCodecSpec>& specs, const std::vector<int32_t>& prompt,
                                           const std::vector<int32_t>& ids) {
  std::vector<std::vector<float>> rows;
  auto gpu = CudaDecoder::load(dir, test_options(specs));
  EXPECT_TRUE(gpu.ok()) << (gpu.ok() ? "" : gpu.error().to_string());
  if (!gpu.ok()) return rows;
  StepBatch b;
  b.tokens = prompt;
  b.seqs = {span_at(0, 0, int32_t(prompt.size()), false)};
  int32_t am = -1;
  for (size_t s = 0; s < ids.size(); ++s) {
    std::vector<float> got(static_cast<size_t>((*gpu)->config().vocab_size));
    EXPECT_TRUE((*gpu)->forward(b, &am, got.data()).ok());
    rows.push_back(std::move(got));
    b.seqs[0].pos0 += b.seqs[0].n_tokens;
    b.seqs[0].n_tokens = 1;
    b.tokens = {ids[s]};
  }
  return rows;
}

TEST(GpuKvCodecModelSteps, WindowsAndSharedKvMatchTheCpu) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const char* name : {"gemma3-tiny", "gemma4-tiny"}) {
    SCOPED_TRACE(name);
    const std::filesystem::path copy =
        std::filesystem::temp_directory_path() / ("strata_codec_window_" + std::string(name) + "_" + std::to_string(::getpid()));
    write_bf16_rounded_copy(model_path(name), copy);
    ThreadPool pool(2);
    auto cpu = load_model(copy.string(), pool);
    ASSERT_TRUE(cpu.ok()) << cpu.error().to_string();
    const ModelConfig& cfg = (*cpu)->config();
    ASSERT_GT(cfg.sliding_window, 0);
    constexpr int32_t kSteps = 8;
    const std::vector<int32_t> prompt = prompt_ids(cfg.vocab_size, 37, 1234);
    const CpuRun exact = cpu_greedy(**cpu, {}, prompt, kSteps);
    // The default rows: f32, f32 attention.
    const auto f32_rows = gpu_forced(copy.string(), {}, prompt, exact.ids);
    ASSERT_EQ(f32_rows.size(), exact.logits.size());
    double worst_f32 = 0.0;
    std::vector<double> floor(exact.logits.size());
    for (size_t s = 0; s < f32_rows.size(); ++s) {
      const double err = max_norm_rel(f32_rows[s], exact.logits[s]);
      worst_f32 = std::max(worst_f32, err);
      EXPECT_LE(err, 1e-2) << "f32 rows, step " << s;
    }
    const auto bf16_rows = gpu_forced(copy.string(), std::vector<KvCodecSpec>(size_t(cfg.n_layers), KvCodecSpec{KvCodec::kBf16, 0}),
                                      prompt, exact.ids);
    ASSERT_EQ(bf16_rows.size(), exact.logits.size());
    for (size_t s = 0; s < bf16_rows.size(); ++s) floor[s] = max_norm_rel(bf16_rows[s], exact.logits[s]);
    std::printf("%s f32 rows vs CPU exact KV: worst %.3e; bf16 rows: worst %.3e\n", name, worst_f32,
                *std::max_element(floor.begin(), floor.end()));
    for (const CodecCase& cc : codec_cases()) {
      SCOPED_TRACE(cc.name);
      const std::vector<KvCodecSpec> specs = layer_specs(cfg, cc.config);
      const CpuRun ref = cpu_greedy(**cpu, specs, prompt, kSteps, &exact.ids);
      const auto rows = gpu_forced(copy.string(), specs, prompt, exact.ids);
      ASSERT_EQ(rows.size(), ref.logits.size());
      double worst = 0.0, worst_codec = 0.0;
      for (size_t s = 0; s < rows.size(); ++s) {
        const double e = max_norm_rel(ref.logits[s], exact.logits[s]);
        const double err = max_norm_rel(rows[s], ref.logits[s]);
        worst = std::max(worst, err);
        worst_codec = std::max(worst_codec, e);
        EXPECT_LE(err, 2e-2 + e + floor[s]) << "step " << s << " (codec error on the CPU " << e << ", bf16 floor " << floor[s] << ")";
      }
      std::printf("%s %-22s worst over 9 rows: codec error on the CPU %.3e; GPU codec vs CPU codec %.3e\n", name, cc.name, worst_codec,
                  worst);
    }
    std::filesystem::remove_all(copy);
  }
}

// Seq A: the prompt in one step, every position's logits. Seq B: the same prompt as a 5-token
// chunk, then one token per step; seq C (another prompt) is prefilled in 6-token chunks in
// the same steps. B's rows must match A's.
constexpr int32_t kPrefillLen = 40;

// Seq A's logits: the test prompt prefilled in one step (blocks 0..).
std::vector<float> prefill_rows(CudaDecoder& m, std::vector<int32_t>* am = nullptr) {
  const int32_t vocab = m.config().vocab_size;
  std::vector<float> ref(size_t(kPrefillLen) * size_t(vocab));
  std::vector<int32_t> ids(static_cast<size_t>(kPrefillLen));
  StepBatch a;
  a.tokens = prompt_ids(vocab, kPrefillLen, 77);
  a.seqs = {span_at(0, 0, kPrefillLen, true)};
  EXPECT_TRUE(m.forward(a, ids.data(), ref.data()).ok());
  if (am != nullptr) *am = ids;
  return ref;
}

// tol: per position, or bitwise equality when negative.
void check_prefill_matches_decode(CudaDecoder& m, const std::string& what, const std::vector<double>& tol) {
  const int32_t vocab = m.config().vocab_size;
  constexpr int32_t kLen = kPrefillLen;
  const std::vector<int32_t> prompt = prompt_ids(vocab, kLen, 77), other = prompt_ids(vocab, 70, 78);
  std::vector<int32_t> am;
  const std::vector<float> ref = prefill_rows(m, &am);
  double worst = 0.0;
  int32_t off_argmax = 0;
  int32_t pos = 0, other_pos = 0;
  std::vector<float> got(size_t(kLen + 6) * size_t(vocab));
  std::vector<int32_t> got_am(static_cast<size_t>(kLen + 6));
  while (pos < kLen) {
    StepBatch b;
    const int32_t n = pos == 0 ? 5 : 1;
    b.tokens.assign(prompt.begin() + pos, prompt.begin() + pos + n);
    b.seqs.push_back(span_at(16, pos, n, true));
    if (other_pos < int32_t(other.size())) {
      const int32_t k = std::min<int32_t>(6, int32_t(other.size()) - other_pos);
      b.tokens.insert(b.tokens.end(), other.begin() + other_pos, other.begin() + other_pos + k);
      b.seqs.push_back(span_at(32, other_pos, k, false));
      other_pos += k;
    }
    ASSERT_TRUE(m.forward(b, got_am.data(), got.data()).ok());
    for (int32_t i = 0; i < n; ++i) {
      const std::vector<float> row(got.begin() + size_t(i) * vocab, got.begin() + size_t(i + 1) * vocab);
      const std::vector<float> want(ref.begin() + size_t(pos + i) * vocab, ref.begin() + size_t(pos + i + 1) * vocab);
      const double err = max_norm_rel(row, want);
      worst = std::max(worst, err);
      const double t = tol[size_t(pos + i)];
      if (t < 0) {
        EXPECT_EQ(std::memcmp(row.data(), want.data(), row.size() * 4), 0) << what << " position " << pos + i << ": max-norm rel " << err;
      } else {
        EXPECT_LE(err, t) << what << " position " << pos + i;
      }
      if (!near_tie(want.data(), vocab, std::max(t, 0.0)) && got_am[size_t(i)] != am[size_t(pos + i)]) ++off_argmax;
    }
    pos += n;
  }
  EXPECT_EQ(off_argmax, 0) << what;
  std::printf("%-34s prefill vs chunk + decode in mixed steps: worst max-norm rel %.3e over %d positions\n", what.c_str(), worst,
              kLen);
}

TEST(GpuKvCodecModelSteps, PrefillMatchesDecodeInMixedSteps) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const char* name : {"llama3-tiny", "qwen3-tiny"}) {
    auto cfg = load_model_config(model_path(name));
    ASSERT_TRUE(cfg.ok());
    for (const CodecCase& cc : codec_cases()) {
      auto m = CudaDecoder::load(model_path(name), test_options(layer_specs(*cfg, cc.config)));
      ASSERT_TRUE(m.ok()) << m.error().to_string();
      check_prefill_matches_decode(**m, std::string(name) + " " + cc.name, std::vector<double>(40, 2e-2));
    }
    auto bf16 = CudaDecoder::load(model_path(name), test_options({}));
    ASSERT_TRUE(bf16.ok());
    check_prefill_matches_decode(**bf16, std::string(name) + " bf16 decoder", std::vector<double>(40, 2e-2));
  }
  // Head dim 128, GQA group 4: the tensor-core codec kernel.
  ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.hidden = 512;
  cfg.n_layers = 2;
  cfg.n_heads = 8;
  cfg.n_kv_heads = 2;
  cfg.head_dim = 128;
  cfg.intermediate = 1024;
  cfg.vocab_size = 1024;
  cfg.max_position = 4096;
  cfg.rms_eps = 1e-5f;
  cfg.hidden_act = "silu";
  std::vector<float> bf16_ref;
  {
    auto m = CudaDecoder::random(cfg, test_options({}), 5, 0.05f);
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    bf16_ref = prefill_rows(**m);
    check_prefill_matches_decode(**m, "random hd128 bf16 decoder", std::vector<double>(40, 2e-2));
  }
  const int32_t vocab = cfg.vocab_size;
  for (const CodecCase& cc : codec_cases()) {
    if (std::string(cc.name).find("mixed") != std::string::npos) continue;  // 2 layers
    auto m = CudaDecoder::random(cfg, test_options(layer_specs(cfg, cc.config)), 5, 0.05f);
    ASSERT_TRUE(m.ok()) << m.error().to_string();
    // Per position: 2e-2 + the codec's own error (its prefill rows against the bf16 decoder's).
    const std::vector<float> codec_ref = prefill_rows(**m);
    std::vector<double> tol(40);
    for (size_t p = 0; p < tol.size(); ++p) {
      const std::vector<float> a(codec_ref.begin() + p * vocab, codec_ref.begin() + (p + 1) * vocab);
      const std::vector<float> b(bf16_ref.begin() + p * vocab, bf16_ref.begin() + (p + 1) * vocab);
      tol[p] = 2e-2 + max_norm_rel(a, b);
    }
    check_prefill_matches_decode(**m, std::string("random hd128 ") + cc.name, tol);
    CudaModelOptions det = test_options(layer_specs(cfg, cc.config));
    det.deterministic = true;
    auto m3 = CudaDecoder::random(cfg, det, 5, 0.05f);
    ASSERT_TRUE(m3.ok());
    check_prefill_matches_decode(**m3, std::string("random hd128 deterministic ") + cc.name, std::vector<double>(40, -1.0));
  }
}

TEST(GpuKvCodecModelSteps, CodecBlocksCopiedThroughTheExecutorReadTheSame) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  for (const CodecCase& cc : codec_cases()) {
    SCOPED_TRACE(cc.name);
    auto cfg = load_model_config(model_path("qwen3-tiny"));
    ASSERT_TRUE(cfg.ok());
    auto dec = CudaDecoder::load(model_path("qwen3-tiny"), test_options(layer_specs(*cfg, cc.config)));
    ASSERT_TRUE(dec.ok()) << dec.error().to_string();
    CudaExecutor ex(std::move(dec).value());
    CudaDecoder& m = ex.decoder();
    const std::vector<int64_t> parts = ex.block_tensor_bytes();
    int64_t sum = 0;
    for (int64_t p : parts) sum += p;
    EXPECT_EQ(sum, m.kv_block_bytes());
    ASSERT_EQ(parts.size(), size_t(2 * cfg->n_layers));
    const int32_t vocab = cfg->vocab_size;
    const std::vector<int32_t> prompt = prompt_ids(vocab, 40, 9);  // blocks 0..2
    StepBatch b;
    b.tokens = prompt;
    b.seqs = {span_at(0, 0, 40, false)};
    int32_t am = 0;
    std::vector<float> first(static_cast<size_t>(vocab)), second(static_cast<size_t>(vocab));
    ASSERT_TRUE(m.forward(b, &am).ok());
    // Blocks 0..2 to 16..18 in one batched copy each way, and block 2 again one at a time to 17.
    std::vector<uint8_t> bytes(size_t(3 * sum));
    const std::vector<int32_t> from = {0, 1, 2}, to = {16, 17, 18};
    ex.read_blocks(from, bytes.data());
    ex.write_blocks(to, bytes.data());
    std::vector<uint8_t> one(static_cast<size_t>(sum));
    ex.read_block(1, one.data());
    EXPECT_EQ(std::memcmp(one.data(), bytes.data() + sum, size_t(sum)), 0) << "read_block and read_blocks agree";
    ex.write_block(17, one.data());
    StepBatch d;
    d.tokens = {prompt.back()};
    d.seqs = {span_at(0, 40, 1, false)};
    ASSERT_TRUE(m.forward(d, &am, first.data()).ok());
    d.seqs = {span_at(16, 40, 1, false)};
    ASSERT_TRUE(m.forward(d, &am, second.data()).ok());
    EXPECT_EQ(std::memcmp(first.data(), second.data(), first.size() * 4), 0) << "logits from the copied blocks";
  }
}

// The Engine over CudaExecutor with a codec pool (make_cuda_engine_parts with kv_codecs): a
// greedy request's tokens are the CudaDecoder's own greedy run with that codec, and the same
// prompt again (a prefix-cache hit on codec blocks) gives them again.
TEST(GpuKvCodecModelSteps, EngineWithCodecPoolGeneratesTheDecoderGreedyIds) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  auto cfg = load_model_config(model_path("qwen3-tiny"));
  ASSERT_TRUE(cfg.ok());
  constexpr int32_t kTokens = 8;
  for (const CodecCase& cc : codec_cases()) {
    SCOPED_TRACE(cc.name);
    const std::vector<int32_t> prompt = prompt_ids(cfg->vocab_size, 37, 4321);
    std::vector<int32_t> want;
    {
      auto dec = CudaDecoder::load(model_path("qwen3-tiny"), test_options(layer_specs(*cfg, cc.config)));
      ASSERT_TRUE(dec.ok()) << dec.error().to_string();
      StepBatch b;
      b.tokens = prompt;
      b.seqs = {span_at(0, 0, int32_t(prompt.size()), false)};
      for (int32_t i = 0; i < kTokens; ++i) {
        int32_t am = -1;
        ASSERT_TRUE((*dec)->forward(b, &am).ok());
        want.push_back(am);
        b.seqs[0].pos0 += b.seqs[0].n_tokens;
        b.seqs[0].n_tokens = 1;
        b.tokens = {am};
      }
    }
    CudaEngineOptions co;
    co.kv_cache_bytes = int64_t(16) << 20;
    co.block_size = 16;
    co.max_batch_tokens = 64;
    co.max_num_seqs = 8;
    co.max_model_len = 256;
    co.kv_codecs = cc.config;
    auto parts = make_cuda_engine_parts(model_path("qwen3-tiny"), co);
    ASSERT_TRUE(parts.ok()) << parts.error().to_string();
    EngineOptions eo;
    eo.block_size = 16;
    eo.max_batch_tokens = 64;  // the 37-token prompt in one chunk, decodes after it
    eo.max_num_seqs = 8;
    eo.max_model_len = 256;
    eo.kv_codecs = parts->kv_codecs;
    eo.model_identity = "qwen3-tiny";
    auto engine = Engine::create(std::move(parts->shape), eo, std::move(parts->executor));
    ASSERT_TRUE(engine.ok()) << engine.error().to_string();
    (*engine)->start();
    for (int rep = 0; rep < 2; ++rep) {
      GenerationRequest r;
      r.id = std::string("codec-") + std::to_string(rep);
      r.prompt = prompt;
      r.max_tokens = kTokens;
      r.sampling.temperature = 0.0f;
      r.ignore_eos = true;
      auto st = (*engine)->submit(r);
      ASSERT_TRUE(st.ok()) << st.error().to_string();
      std::vector<int32_t> got;
      for (;;) {
        auto e = (*st)->next(std::chrono::seconds(60));
        ASSERT_TRUE(e.has_value()) << "request timed out";
        got.insert(got.end(), e->tokens.begin(), e->tokens.end());
        if (e->final) break;
      }
      EXPECT_EQ(got, want) << "run " << rep << (rep == 1 ? " (prefix-cache hit)" : "");
    }
    (*engine)->shutdown();
  }
}

TEST(GpuKvCodecModelSteps, EngineSupportAcceptsCodecsAndNamesRefusals) {
  auto llama = load_model_config(model_path("llama3-tiny"));
  ASSERT_TRUE(llama.ok());
  for (const CodecCase& cc : codec_cases()) EXPECT_TRUE(check_cuda_engine_support(*llama, cc.config).ok()) << cc.name;
  // Sliding windows (Gemma 3) and shared KV with per-layer geometry (Gemma 4) take codecs too.
  for (const char* name : {"gemma3-tiny", "gemma4-tiny", "gemma4moe-tiny"}) {
    auto cfg = load_model_config(model_path(name));
    ASSERT_TRUE(cfg.ok());
    for (const CodecCase& cc : codec_cases()) {
      const Status st = check_cuda_engine_support(*cfg, cc.config);
      EXPECT_TRUE(st.ok()) << name << " " << cc.name << ": " << (st.ok() ? "" : st.error().message);
    }
  }
  // --kv-quant-start runs for full-attention models and, their windows kept exact, for
  // sliding-window ones (gpu_kv_quant_test).
  KvCodecConfig quant;
  quant.default_spec.codec = KvCodec::kInt8;
  quant.quant_start = 64;
  EXPECT_TRUE(check_cuda_engine_support(*llama, quant).ok());
  auto gemma = load_model_config(model_path("gemma3-tiny"));
  ASSERT_TRUE(gemma.ok());
  const Status q = check_cuda_engine_support(*gemma, quant);
  EXPECT_TRUE(q.ok()) << q.error().to_string();
  ModelConfig odd = *llama;
  odd.head_dim = 24;  // no codec kernel for it
  KvCodecConfig int8;
  int8.default_spec.codec = KvCodec::kInt8;
  int8.default_spec.group_size = 8;
  const Status s = check_cuda_engine_support(odd, int8);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.error().message.find("head dim"), std::string::npos) << s.error().message;
  // The namespace names the codecs the pool holds (auto is the device's bf16).
  EXPECT_NE(codec_namespace(cuda_kv_codecs(KvCodecConfig{}, false)), codec_namespace(cuda_kv_codecs(int8, false)));
}

}  // namespace
}  // namespace strata::cuda
