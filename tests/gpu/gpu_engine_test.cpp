// The Engine on the GPU (CudaExecutor): the reference goldens' greedy ids through the whole
// engine by the teacher-forced rule of gpu_golden_test.cpp (at generated step i, with the
// prompt and the oracle's first i greedy ids as context, the engine's greedy token must be
// among the oracle's top-5), with chunked prefill (a 64-token step budget), several sequences
// per step and prefix-cache hits; greedy rows answered by the device argmax agree with rows
// that ask for logprobs (the device sampler's greedy token); a KV block survives the
// executor's host round trip bit for bit; a prompt pushed out of a small pool into the KV host
// tier (registered host memory, direct copies both ways) comes back from it with the same
// greedy tokens as a device prefix cache hit. Needs a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>
#include <tuple>

#include "../support/stream_test_support.h"
#include "engine/engine.h"
#include "gpu_engine_oracle.h"
#include "gpu_oracle.h"
#include "gpu_test_util.h"
#include "runtime/cuda/cuda_executor.h"

namespace strata::cuda {
namespace {

using test::drain;
using test::greedy_request;
using test::Outcome;

using namespace strata::gpu_test;

CudaEngineOptions small_device(int32_t max_batch_tokens) {
  CudaEngineOptions o;
  o.kv_cache_bytes = int64_t(32) << 20;
  o.block_size = 16;
  o.max_batch_tokens = max_batch_tokens;
  o.max_num_seqs = 8;
  o.max_model_len = 256;
  return o;
}

std::unique_ptr<Engine> start_gpu_engine(const std::string& name, int32_t max_batch_tokens, bool device_sampling = true) {
  auto parts = make_cuda_engine_parts(model_path(name), small_device(max_batch_tokens));
  EXPECT_TRUE(parts.ok()) << (parts.ok() ? "" : parts.error().to_string());
  if (!parts.ok()) return nullptr;
  EXPECT_TRUE(parts->executor->device_sampling()) << "the device sampling scratch is taken";
  parts->executor->set_device_sampling(device_sampling);
  EngineOptions eo;
  eo.block_size = 16;
  eo.max_batch_tokens = max_batch_tokens;
  eo.max_num_seqs = 8;
  eo.max_model_len = 256;
  eo.max_queued = 1024;
  eo.kv_codecs = parts->kv_codecs;
  eo.model_identity = name;
  const int32_t device_blocks = parts->executor->n_kv_blocks();
  auto e = Engine::create(std::move(parts->shape), eo, std::move(parts->executor));
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  if (!e.ok()) return nullptr;
  EXPECT_EQ((*e)->n_kv_blocks(), device_blocks) << "the engine plans with the device pool";
  (*e)->start();
  return std::move(e).value();
}

class GpuEngine : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GpuEngine, TeacherForcedGoldensInMixedChunkedBatches) {
  const std::string name = GetParam();
  const auto cases = cases_for(name);
  ASSERT_FALSE(cases.empty()) << "no cases for " << name;
  auto engine = start_gpu_engine(name, 64);  // the 100-token prompts prefill in chunks
  ASSERT_NE(engine, nullptr);
  expect_teacher_forced_in_engine(*engine, name, cases);
  const EngineStats st = engine->stats();
  EXPECT_GT(st.prefix_hit_tokens, 0) << "later contexts reuse the blocks of earlier ones";
  engine->shutdown();
}

TEST_P(GpuEngine, FreeRunningGreedyFollowsTheOracleUntilATop5Tie) {
  const std::string name = GetParam();
  const auto cases = cases_for(name);
  auto engine = start_gpu_engine(name, 48);
  ASSERT_NE(engine, nullptr);
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (size_t c = 0; c < cases.size(); ++c) {
    auto s = engine->submit(greedy_request(name + "-free-" + std::to_string(c), cases[c].prompt, int32_t(cases[c].greedy.size())));
    ASSERT_TRUE(s.ok()) << s.error().to_string();
    streams.push_back(*s);
  }
  // A sampled request in the same batches takes the host path.
  GenerationRequest sampled = greedy_request(name + "-sampled", cases.back().prompt, 16);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.top_k = 20;
  sampled.sampling.seed = 7;
  sampled.sampling.has_seed = true;
  auto ss = engine->submit(sampled);
  ASSERT_TRUE(ss.ok()) << ss.error().to_string();
  for (size_t c = 0; c < cases.size(); ++c) {
    Outcome o = drain(*streams[c]);
    ASSERT_EQ(o.tokens.size(), cases[c].greedy.size()) << o.final.message;
    // Exact until the first divergence, which the rule allows only inside the top-5.
    size_t i = 0;
    while (i < o.tokens.size() && o.tokens[i] == cases[c].greedy[i]) ++i;
    if (i < o.tokens.size()) {
      const auto& top5 = cases[c].top5[i];
      EXPECT_NE(std::find(top5.begin(), top5.end(), o.tokens[i]), top5.end())
          << name << " case " << c << ": diverges at step " << i << " outside the top-5";
    }
  }
  Outcome so = drain(**ss);
  EXPECT_EQ(so.tokens.size(), 16u) << so.final.message;
  engine->shutdown();
}

// The device sampler against the host Sampler on the same device logits: each request runs
// alone (the same step shapes, so the same logits bits) on an engine sampling on the device and
// on one copying the rows to the host. Seeded draws come from the host RNG either way, so the
// tokens must agree (the device's fixed-point masses differ from the host's doubles only within
// ~1e-7 of a token boundary, which 24 draws per request do not meet in practice).
TEST_P(GpuEngine, DeviceSamplingEqualsHostSampling) {
  const std::string name = GetParam();
  const auto cases = cases_for(name);
  auto device = start_gpu_engine(name, 48, true);
  auto host = start_gpu_engine(name, 48, false);
  ASSERT_NE(device, nullptr);
  ASSERT_NE(host, nullptr);
  std::vector<GenerationRequest> reqs;
  auto base = [&](const std::string& id) {
    GenerationRequest r = greedy_request(name + "-" + id, cases.front().prompt, 24);
    r.sampling.seed = 1234 + reqs.size();
    r.sampling.has_seed = true;
    return r;
  };
  GenerationRequest r = base("t");
  r.sampling.temperature = 1.0f;
  reqs.push_back(r);
  r = base("topk");
  r.sampling.temperature = 0.8f;
  r.sampling.top_k = 20;
  reqs.push_back(r);
  r = base("topp");
  r.sampling.temperature = 0.9f;
  r.sampling.top_p = 0.9f;
  reqs.push_back(r);
  r = base("minp");
  r.sampling.temperature = 1.2f;
  r.sampling.min_p = 0.05f;
  reqs.push_back(r);
  r = base("penalties");
  r.sampling.temperature = 0.7f;
  r.sampling.top_p = 0.95f;
  r.sampling.repetition_penalty = 1.3f;
  r.sampling.presence_penalty = 0.5f;
  r.sampling.frequency_penalty = 0.3f;
  reqs.push_back(r);
  r = base("greedy-penalty-bias");
  r.sampling.temperature = 0.0f;
  r.sampling.repetition_penalty = 1.5f;
  r.sampling.logit_bias = {{cases.front().greedy.at(0), -100.0f}, {7, 3.0f}};
  reqs.push_back(r);
  for (const auto& q : reqs) {
    auto sd = device->submit(q);
    ASSERT_TRUE(sd.ok()) << sd.error().to_string();
    Outcome od = drain(**sd);
    auto sh = host->submit(q);
    ASSERT_TRUE(sh.ok()) << sh.error().to_string();
    Outcome oh = drain(**sh);
    ASSERT_EQ(od.tokens.size(), 24u) << q.id << ": " << od.final.message;
    EXPECT_EQ(od.tokens, oh.tokens) << q.id << ": device and host sampling differ";
  }
  device->shutdown();
  host->shutdown();
}

// gemma4moe-tiny is checked in gpu_golden_test only: its teacher-forced rule lies under the
// bf16-weight floor (GpuGoldenFloor), so it would fail here for the same reason.
INSTANTIATE_TEST_SUITE_P(Families, GpuEngine, ::testing::Values("llama3-tiny", "qwen3-tiny", "qwen2-tiny", "mistral-tiny", "gemma3-tiny", "qwen3moe-tiny",
                                                           "gemma4-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

TEST(GpuEngineExecutor, KvBlockHostRoundTripIsExact) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  auto parts = make_cuda_engine_parts(model_path("llama3-tiny"), small_device(64));
  ASSERT_TRUE(parts.ok()) << parts.error().to_string();
  CudaExecutor& ex = *parts->executor;
  const auto tensors = ex.block_tensor_bytes();
  int64_t bytes = 0;
  for (int64_t b : tensors) bytes += b;
  ASSERT_EQ(bytes, ex.decoder().kv_block_bytes());
  // Block 2 holds a forward's K/V; it goes to the host, into block 9, and back.
  StepBatch batch;
  batch.tokens = {5, 17, 33, 2, 9, 100, 7, 8, 1, 3, 4, 6, 10, 11, 12, 13};
  SeqSpan span;
  span.n_tokens = 16;
  span.block_table = {2};
  batch.seqs = {span};
  std::vector<int32_t> am(1);
  ASSERT_TRUE(ex.decoder().forward(batch, am.data()).ok());
  const size_t n = static_cast<size_t>(bytes);
  std::vector<uint8_t> a(n), b(n, 0xAB), c(n);
  ex.read_block(2, a.data());
  EXPECT_NE(std::count(a.begin(), a.end(), uint8_t(0)), int64_t(bytes)) << "the forward wrote block 2";
  ex.write_block(9, a.data());
  ex.read_block(9, b.data());
  EXPECT_EQ(a, b);
  // Random bytes (not only what a forward writes) come back unchanged too.
  std::mt19937 rng(fresh_seed());
  for (auto& x : c) x = uint8_t(rng());
  ex.write_block(4, c.data());
  std::vector<uint8_t> d(n);
  ex.read_block(4, d.data());
  EXPECT_EQ(c, d);
  EXPECT_THROW(ex.read_block(ex.n_kv_blocks(), d.data()), std::exception);
}

// A 16-block pool: the second prompt evicts the first one's blocks to the host tier (copied
// straight into its registered slots); the first prompt then promotes them back (straight out of
// the slots) and its greedy tokens equal those of the hit on the device prefix cache, which ran
// on the same cached KV before it left the device.
TEST(GpuEngineTiers, HostTierHitMatchesTheDeviceCacheHit) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  auto cfg = load_model_config(model_path("llama3-tiny"));
  ASSERT_TRUE(cfg.ok());
  // The f32 checkpoint's default KV rows are f32 (split weights: cuda_model.h kv_codecs).
  KvPoolLayout l{cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, 16};
  l.row_bytes.assign(size_t(2 * cfg->n_layers), 4 * cfg->head_dim);
  CudaEngineOptions o = small_device(64);
  o.kv_cache_bytes = 16 * l.bytes_per_block();
  auto parts = make_cuda_engine_parts(model_path("llama3-tiny"), o);
  ASSERT_TRUE(parts.ok()) << parts.error().to_string();
  ASSERT_EQ(parts->executor->n_kv_blocks(), 16);
  EngineOptions eo;
  eo.block_size = 16;
  eo.max_batch_tokens = 64;
  eo.max_num_seqs = 8;
  eo.max_model_len = 256;
  eo.kv_codecs = parts->kv_codecs;
  eo.model_identity = "llama3-tiny";
  eo.kv_host_bytes = 64 * l.bytes_per_block();
  auto e = Engine::create(std::move(parts->shape), eo, std::move(parts->executor));
  ASSERT_TRUE(e.ok()) << e.error().to_string();
  Engine& engine = **e;
  engine.start();
  std::mt19937 rng(12);
  auto prompt = [&] {
    std::vector<int32_t> p(160);
    for (auto& t : p) t = 3 + int32_t(rng() % 500);  // the vocabulary has 512 ids
    return p;
  };
  const std::vector<int32_t> a = prompt(), b = prompt();
  auto run = [&](const std::string& id, const std::vector<int32_t>& p) {
    auto s = engine.submit(greedy_request(id, p, 8));
    EXPECT_TRUE(s.ok());
    return s.ok() ? drain(**s) : Outcome{};
  };
  const Outcome cold = run("cold", a);
  const Outcome device_hit = run("device-hit", a);
  EXPECT_EQ(device_hit.final.usage.cached_tokens, 144);  // 9 full blocks; the last token is computed
  run("other", b);
  const Outcome host_hit = run("host-hit", a);
  EXPECT_EQ(host_hit.final.usage.cached_tokens, 144);
  EXPECT_EQ(host_hit.tokens, device_hit.tokens);
  EXPECT_EQ(cold.tokens.size(), 8u);
  KvTierStats t;
  for (int i = 0; i < 100; ++i) {  // stats are published by the engine loop
    t = engine.stats().kv_tiers;
    if (t.host_hit_blocks > 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(t.enabled);
  EXPECT_GT(t.host_hit_blocks, 0) << "the repeat was served from the host tier";
  EXPECT_GT(t.demoted_blocks, 0);
  engine.shutdown();
}

// An f32 checkpoint keeps f32 KV rows by default, and the engine's codec config says so (it names
// the prefix-cache namespace); bf16 asked for by name gives bf16 rows, half the bytes a block.
TEST(GpuEngineExecutor, KvRowsAreF32ForF32CheckpointsUnlessBf16IsAsked) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  CudaEngineOptions o = small_device(64);
  o.kv_cache_bytes = int64_t(8) << 20;
  auto f32 = make_cuda_engine_parts(model_path("llama3-tiny"), o);
  ASSERT_TRUE(f32.ok()) << f32.error().to_string();
  EXPECT_TRUE(f32->executor->decoder().kv_f32_rows());
  EXPECT_EQ(f32->kv_codecs.default_spec.codec, KvCodec::kAuto);
  EXPECT_EQ(codec_namespace(f32->kv_codecs), codec_namespace(KvCodecConfig{}));
  o.kv_codecs.default_spec.codec = KvCodec::kBf16;
  auto bf16 = make_cuda_engine_parts(model_path("llama3-tiny"), o);
  ASSERT_TRUE(bf16.ok()) << bf16.error().to_string();
  EXPECT_FALSE(bf16->executor->decoder().kv_f32_rows());
  EXPECT_EQ(bf16->kv_codecs.default_spec.codec, KvCodec::kBf16);
  EXPECT_NE(codec_namespace(bf16->kv_codecs), codec_namespace(f32->kv_codecs));
  EXPECT_EQ(f32->executor->decoder().kv_block_bytes(), 2 * bf16->executor->decoder().kv_block_bytes());
}

TEST(GpuEngineExecutor, UnsupportedModelsAreRefusedNamingTypeAndDevice) {
  if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  ModelConfig mamba;
  mamba.model_type = "mamba";
  mamba.n_layers = 2;
  const Status refused = check_cuda_engine_support(mamba, KvCodecConfig{});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(refused.error().message.find("mamba"), std::string::npos) << refused.error().message;
  EXPECT_NE(refused.error().message.find("--device cuda"), std::string::npos) << refused.error().message;
  // KV codecs run on the device (gpu_kv_codec_model_test), and --kv-quant-start for
  // full-attention models (gpu_kv_quant_test); a sliding-window model refuses it naming the flag.
  KvCodecConfig int8;
  int8.default_spec.codec = KvCodec::kInt8;
  int8.quant_start = 64;
  auto gemma = load_model_config(model_path("gemma3-tiny"));
  ASSERT_TRUE(gemma.ok());
  const Status s = check_cuda_engine_support(*gemma, int8);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.error().code, ErrorCode::kUnsupported);
  EXPECT_NE(s.error().message.find("--kv-quant-start 64"), std::string::npos) << s.error().message;
}

}  // namespace
}  // namespace strata::cuda
