// Overlapped ("async") scheduling on the GPU (EngineOptions::async_scheduling, CudaExecutor::
// enqueue / collect) against one step at a time: the same workload on two engines, tokens
// compared request by request. The workload mixes greedy, seeded sampling and device-sampled
// greedy rows (logit bias), many requests at once in a small KV pool (preemptions), shared
// prompt prefixes (prefix-cache hits), varied max_tokens, and, with batch-invariant kernels
// (--deterministic, so a request's logits do not depend on the step's other rows), stop ids
// and EOS that end requests mid-pipeline, a cancellation, a request with logprobs (computed by
// the device sampler, so it overlaps), one with penalties (its fed token joins its penalty
// history on the device, so it overlaps too) and a host-bound one (prompt logprobs) that makes
// the engine fall back to single steps while it lives. With the default kernels only
// max_tokens ends requests: overlapped scheduling then plans the very same steps, so even
// batch-dependent kernels give the same bits. Requests with logprobs: the device's logprobs,
// overlapped or not, against the host's (Sampler::logprobs over copied logits rows). Requests
// with repetition, presence and frequency penalties: overlapped, one step at a time, and with
// the host's sampler. Constrained requests (a regex grammar over a synthetic vocabulary of the
// model's width): overlapped (sampling queued after the masks, no token fill), one step at a
// time with the device's masked sampler (token fill on) and with the host's sampler give the
// same tokens, each accepted by the grammar. Models: llama3-tiny, qwen3-tiny and gemma3-tiny (whose sliding-window
// layers page in a pool of their own, giving back blocks behind the window while a step that
// read them may still be in flight). With host and disk KV tiers, checkpoints and (qwen35-tiny)
// recurrent-state snapshots, overlapped steps give the tokens of single steps, and a stopped
// run resumes from its checkpoints with the uninterrupted tokens. Needs a GPU.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>
#include <random>
#include <thread>

#include "engine/engine.h"
#include "gpu_test_util.h"
#include "model/model_config.h"
#include "runtime/cuda/cuda_executor.h"
#include "sampling/grammar/grammar.h"
#include "sampling/grammar/matcher.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

constexpr int32_t kMaxSeqs = 16;
constexpr int32_t kBatchTokens = 96;
constexpr int32_t kMaxLen = 256;
constexpr int32_t kPoolBlocks = 20;  // 320 tokens for up to 16 sequences of up to 256: preemptions

std::unique_ptr<Engine> make_engine(const std::string& name, bool overlap, bool deterministic, bool device_logprobs = true,
                                    bool device_sampling = true, const std::function<void(EngineOptions&)>& tweak = nullptr) {
  auto cfg = load_model_config(model_path(name));
  EXPECT_TRUE(cfg.ok());
  if (!cfg.ok()) return nullptr;
  CudaEngineOptions o;
  // f32 K and V rows of every layer (these f32 checkpoints keep f32 KV), 16 tokens a block.
  o.kv_cache_bytes = int64_t(kPoolBlocks) * 2 * cfg->n_layers * 16 * cfg->n_kv_heads * cfg->head_dim * 4;
  o.block_size = 16;
  o.max_batch_tokens = kBatchTokens;
  o.max_num_seqs = kMaxSeqs;
  o.max_model_len = kMaxLen;
  o.deterministic = deterministic;
  auto parts = make_cuda_engine_parts(model_path(name), o);
  EXPECT_TRUE(parts.ok()) << (parts.ok() ? "" : parts.error().to_string());
  if (!parts.ok()) return nullptr;
  EXPECT_TRUE(parts->executor->supports_overlap());
  EXPECT_TRUE(parts->executor->device_logprobs()) << "the device logprobs buffers are taken";
  parts->executor->set_device_logprobs(device_logprobs);
  parts->executor->set_device_sampling(device_sampling);
  EXPECT_EQ(parts->executor->device_penalties(), device_sampling) << "overlapped steps take rows with penalties";
  EngineOptions eo;
  eo.block_size = 16;
  eo.max_batch_tokens = kBatchTokens;
  eo.max_num_seqs = kMaxSeqs;
  eo.max_model_len = kMaxLen;
  eo.max_queued = 1024;
  eo.kv_codecs = parts->kv_codecs;
  eo.model_identity = name;
  eo.async_scheduling = overlap;
  if (tweak) tweak(eo);
  auto e = Engine::create(std::move(parts->shape), eo, std::move(parts->executor));
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  if (!e.ok()) return nullptr;
  return std::move(e).value();
}

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<int32_t> logprob_ids;  // the chosen id of each logprobs entry
  std::vector<TokenLogprobs> logprobs;
  FinishReason reason = FinishReason::kError;
  std::string message;
};

Outcome drain(RequestStream& s, int32_t cancel_after, Engine* engine) {
  Outcome o;
  bool cancelled = false;
  for (;;) {
    auto e = s.next(std::chrono::seconds(120));
    if (!e) {
      ADD_FAILURE() << "request " << s.id() << " timed out";
      return o;
    }
    o.tokens.insert(o.tokens.end(), e->tokens.begin(), e->tokens.end());
    for (const auto& lp : e->logprobs) o.logprob_ids.push_back(lp.chosen.token);
    o.logprobs.insert(o.logprobs.end(), e->logprobs.begin(), e->logprobs.end());
    if (e->final) {
      o.reason = e->finish_reason;
      o.message = e->message;
      return o;
    }
    if (cancel_after > 0 && !cancelled && int32_t(o.tokens.size()) >= cancel_after) {
      engine->cancel(s.id());
      cancelled = true;
    }
  }
}

struct RunResult {
  std::map<std::string, Outcome> out;
  EngineStats stats;
};

// Queues every request before the engine starts (both engines see the same arrivals), then
// reads the streams; `cancel_id` is read first and cancelled after 3 tokens.
RunResult run_workload(Engine& engine, const std::vector<GenerationRequest>& reqs, const std::string& cancel_id) {
  RunResult r;
  std::map<std::string, std::shared_ptr<RequestStream>> streams;
  for (const auto& q : reqs) {
    auto s = engine.submit(q);
    EXPECT_TRUE(s.ok()) << q.id << ": " << (s.ok() ? "" : s.error().to_string());
    if (s.ok()) streams[q.id] = *s;
  }
  engine.start();
  if (!cancel_id.empty() && streams.count(cancel_id)) r.out[cancel_id] = drain(*streams[cancel_id], 3, &engine);
  for (auto& [id, s] : streams) {
    if (id != cancel_id) r.out[id] = drain(*s, 0, nullptr);
  }
  for (int i = 0; i < 100; ++i) {  // stats are published by the engine loop
    r.stats = engine.stats();
    if (r.stats.running == 0 && r.stats.waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  engine.shutdown();
  return r;
}

// 48 requests: three shared 40-token prefixes (every fourth prompt has none), random suffixes,
// max_tokens 1..48; greedy, seeded top-k, seeded top-p/min-p, and greedy with a logit bias.
std::vector<GenerationRequest> base_workload(uint32_t seed) {
  std::mt19937 rng(seed);
  auto ids = [&](size_t n) {
    std::vector<int32_t> v(n);
    for (auto& t : v) t = 3 + int32_t(rng() % 500);  // the tiny models have 512 ids
    return v;
  };
  const std::vector<std::vector<int32_t>> prefixes = {ids(40), ids(40), ids(40)};
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 48; ++i) {
    GenerationRequest r;
    r.id = "r" + std::to_string(i);
    if (i % 4 != 3) r.prompt = prefixes[size_t(i) % 3];
    const auto suffix = ids(5 + rng() % 60);
    r.prompt.insert(r.prompt.end(), suffix.begin(), suffix.end());
    r.max_tokens = 1 + int32_t(rng() % 48);
    r.ignore_eos = true;
    r.sampling.seed = 1000 + uint64_t(i);
    r.sampling.has_seed = true;
    switch (i % 4) {
      case 0: r.sampling.temperature = 0.0f; break;
      case 1:
        r.sampling.temperature = 0.9f;
        r.sampling.top_k = 50;
        break;
      case 2:
        r.sampling.temperature = 0.7f;
        r.sampling.top_p = 0.9f;
        r.sampling.min_p = 0.02f;
        break;
      default:
        r.sampling.temperature = 0.0f;
        r.sampling.logit_bias = {{int32_t(3 + rng() % 500), 2.0f}};
        break;
    }
    reqs.push_back(std::move(r));
  }
  return reqs;
}

void expect_same(const RunResult& on, const RunResult& off, const std::string& cancel_id, const std::string& what) {
  ASSERT_EQ(on.out.size(), off.out.size());
  for (const auto& [id, a] : off.out) {
    const Outcome& b = on.out.at(id);
    if (id == cancel_id) {
      // Cancelled at a moment the two runs do not share: one stream is a prefix of the other.
      const size_t n = std::min(a.tokens.size(), b.tokens.size());
      EXPECT_TRUE(std::equal(a.tokens.begin(), a.tokens.begin() + long(n), b.tokens.begin())) << what << " " << id;
      EXPECT_GE(n, 3u) << what << " " << id;
      continue;
    }
    EXPECT_EQ(b.reason, a.reason) << what << " " << id << ": " << b.message << " / " << a.message;
    EXPECT_EQ(b.tokens, a.tokens) << what << " " << id << ": overlapped and single steps differ";
    EXPECT_EQ(b.logprob_ids, a.logprob_ids) << what << " " << id;
  }
}

class GpuEngineOverlap : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    if (!has_gpu()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GpuEngineOverlap, MixedWorkloadMatchesSingleSteps) {
  const std::string name = GetParam();
  std::vector<GenerationRequest> reqs = base_workload(11);
  // A first single-step run picks stop ids the requests really meet: for every fifth request,
  // the token it generates halfway (so it stops there, mid-pipeline when overlapped).
  auto pilot_engine = make_engine(name, false, true);
  ASSERT_NE(pilot_engine, nullptr);
  const RunResult pilot = run_workload(*pilot_engine, reqs, "");
  for (size_t i = 0; i < reqs.size(); i += 5) {
    const auto& t = pilot.out.at(reqs[i].id).tokens;
    if (t.size() >= 4) reqs[i].stop_ids = {t[t.size() / 2]};
  }
  for (size_t i = 2; i < reqs.size(); i += 6) reqs[i].ignore_eos = false;  // EOS (id 2) may end these
  // In the middle of the queue: a request with logprobs (answered by the device, overlapped),
  // one with a repetition penalty (overlapped too) and a host-bound one, with prompt logprobs
  // (single steps while it lives).
  GenerationRequest lp = reqs[20];
  lp.id = "logprobs";
  lp.sampling = SamplingParams{};
  lp.sampling.temperature = 0.0f;
  lp.logprobs = 2;
  lp.max_tokens = 6;
  GenerationRequest pen = reqs[30];
  pen.id = "penalty";
  pen.sampling.temperature = 0.8f;
  pen.sampling.repetition_penalty = 1.2f;
  pen.sampling.seed = 77;
  pen.sampling.has_seed = true;
  pen.max_tokens = 8;
  GenerationRequest echo = reqs[35];
  echo.id = "prompt_logprobs";
  echo.prompt_logprobs = true;
  echo.max_tokens = 5;
  reqs.insert(reqs.begin() + 20, lp);
  reqs.insert(reqs.begin() + 31, pen);
  reqs.insert(reqs.begin() + 37, echo);
  // Cancelled after its third token: a long greedy request early in the queue.
  reqs[5].max_tokens = 48;
  reqs[5].stop_ids.clear();
  reqs[5].ignore_eos = true;
  const std::string cancel_id = reqs[5].id;

  auto off_engine = make_engine(name, false, true);
  auto on_engine = make_engine(name, true, true);
  ASSERT_NE(off_engine, nullptr);
  ASSERT_NE(on_engine, nullptr);
  const RunResult off = run_workload(*off_engine, reqs, cancel_id);
  const RunResult on = run_workload(*on_engine, reqs, cancel_id);
  expect_same(on, off, cancel_id, name);
  EXPECT_EQ(off.stats.overlapped_steps, 0);
  // The host-bound request is live (queued or running) for part of the run: steps overlap
  // only once it has ended.
  EXPECT_GT(on.stats.overlapped_steps, 0) << on.stats.steps << " steps";
  EXPECT_LT(on.stats.overlapped_steps, on.stats.steps) << "the host-bound request ran in single steps";
  EXPECT_GT(on.stats.preemptions, 0) << "the small pool preempts";
  EXPECT_GT(on.stats.prefix_hit_tokens, 0) << "shared prefixes hit the cache";
  EXPECT_GT(on.stats.finished[int(FinishReason::kStop)], 0) << "stop ids end requests";
  EXPECT_EQ(on.out.at(cancel_id).reason, FinishReason::kCancelled);
  EXPECT_EQ(on.out.at("logprobs").logprob_ids.size(), on.out.at("logprobs").tokens.size());
}

// A workload where max_tokens alone ends requests, with the default (batch-dependent) kernels:
// overlapped steps plan the same steps as single ones, preempt alike and give the same bits.
void expect_length_only_bit_exact(const std::string& name, const std::vector<GenerationRequest>& reqs) {
  auto off_engine = make_engine(name, false, false);
  auto on_engine = make_engine(name, true, false);
  ASSERT_NE(off_engine, nullptr);
  ASSERT_NE(on_engine, nullptr);
  const RunResult off = run_workload(*off_engine, reqs, "");
  const RunResult on = run_workload(*on_engine, reqs, "");
  expect_same(on, off, "", name);
  EXPECT_EQ(on.stats.steps, off.stats.steps) << "the same plans";
  EXPECT_EQ(on.stats.preemptions, off.stats.preemptions);
  EXPECT_GT(on.stats.preemptions, 0);
  EXPECT_GT(on.stats.overlapped_steps, on.stats.steps / 2);
  for (const auto& [id, o] : on.out) EXPECT_EQ(o.reason, FinishReason::kLength) << id << ": " << o.message;
}

TEST_P(GpuEngineOverlap, LengthOnlyWorkloadIsBitExactWithDefaultKernels) {
  expect_length_only_bit_exact(GetParam(), base_workload(23));
}

// Repetition, presence and frequency penalties (strong enough to change most tokens of the
// tiny models) on every kind of request but every fourth: greedy, seeded top-k, seeded
// top-p/min-p, greedy with a logit bias; some with logprobs.
void add_penalties(std::vector<GenerationRequest>& reqs) {
  for (size_t i = 0; i < reqs.size(); ++i) {
    SamplingParams& p = reqs[i].sampling;
    switch (i % 8) {
      case 0: p.repetition_penalty = 1.8f; break;
      case 1:
        p.repetition_penalty = 1.4f;
        p.frequency_penalty = 0.6f;
        break;
      case 2: p.presence_penalty = 1.5f; break;
      case 3: break;  // none: rows without penalties beside them
      case 4:
        p.frequency_penalty = 1.2f;
        p.presence_penalty = 0.5f;
        break;
      case 5:
        p.repetition_penalty = 0.7f;  // below 1: favours what was seen
        p.presence_penalty = -0.5f;
        break;
      case 6:
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.8f;
        p.frequency_penalty = 0.8f;
        break;
      default: break;
    }
    if (i % 5 == 1) reqs[i].logprobs = 3;
  }
}

// Penalties with batch-invariant kernels: stop ids and EOS that end requests mid-pipeline, a
// cancellation, preemptions in the small pool, prefix hits. Overlapped steps give the tokens of
// single steps and overlap most steps (penalty rows are not host-bound); single steps with the
// host's sampler (the penalty lists applied on the host) give the same tokens too.
TEST_P(GpuEngineOverlap, PenaltiesMatchSingleSteps) {
  const std::string name = GetParam();
  std::vector<GenerationRequest> reqs = base_workload(41);
  add_penalties(reqs);
  auto pilot_engine = make_engine(name, false, true);
  ASSERT_NE(pilot_engine, nullptr);
  const RunResult pilot = run_workload(*pilot_engine, reqs, "");
  for (size_t i = 0; i < reqs.size(); i += 5) {
    const auto& t = pilot.out.at(reqs[i].id).tokens;
    if (t.size() >= 4) reqs[i].stop_ids = {t[t.size() / 2]};
  }
  for (size_t i = 2; i < reqs.size(); i += 6) reqs[i].ignore_eos = false;
  reqs[9].max_tokens = 48;
  reqs[9].stop_ids.clear();
  reqs[9].ignore_eos = true;
  const std::string cancel_id = reqs[9].id;

  auto off_engine = make_engine(name, false, true);
  auto on_engine = make_engine(name, true, true);
  auto host_engine = make_engine(name, false, true, false, false);
  ASSERT_NE(off_engine, nullptr);
  ASSERT_NE(on_engine, nullptr);
  ASSERT_NE(host_engine, nullptr);
  const RunResult off = run_workload(*off_engine, reqs, cancel_id);
  const RunResult on = run_workload(*on_engine, reqs, cancel_id);
  const RunResult host = run_workload(*host_engine, reqs, cancel_id);
  expect_same(on, off, cancel_id, name + " overlapped");
  expect_same(host, off, cancel_id, name + " host sampler");
  EXPECT_EQ(off.stats.overlapped_steps, 0);
  EXPECT_GT(on.stats.overlapped_steps, on.stats.steps / 2) << on.stats.steps << " steps: rows with penalties overlap";
  EXPECT_GT(on.stats.preemptions, 0) << "the small pool preempts";
  EXPECT_GT(on.stats.prefix_hit_tokens, 0) << "shared prefixes hit the cache";
  EXPECT_GT(on.stats.finished[int(FinishReason::kStop)], 0) << "stop ids end requests";
  EXPECT_EQ(on.out.at(cancel_id).reason, FinishReason::kCancelled);
  // The penalties matter: the same workload without them differs for most penalized requests.
  std::vector<GenerationRequest> plain = base_workload(41);
  for (size_t i = 0; i < plain.size(); ++i) {
    plain[i].stop_ids = reqs[i].stop_ids;
    plain[i].ignore_eos = reqs[i].ignore_eos;
  }
  auto plain_engine = make_engine(name, false, true);
  ASSERT_NE(plain_engine, nullptr);
  const RunResult unpenalized = run_workload(*plain_engine, plain, "");
  int32_t changed = 0, penalized = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const SamplingParams& p = reqs[i].sampling;
    if (p.repetition_penalty == 1.0f && p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f) continue;
    if (reqs[i].id == cancel_id || reqs[i].max_tokens < 8) continue;
    ++penalized;
    if (unpenalized.out.at(reqs[i].id).tokens != off.out.at(reqs[i].id).tokens) ++changed;
  }
  EXPECT_GT(changed, penalized / 2) << changed << " of " << penalized << " penalized requests changed by their penalties";
}

// The same with penalties on most requests.
TEST_P(GpuEngineOverlap, PenaltiesLengthOnlyBitExactWithDefaultKernels) {
  std::vector<GenerationRequest> reqs = base_workload(43);
  add_penalties(reqs);
  expect_length_only_bit_exact(GetParam(), reqs);
}

// Device logprobs against host logprobs of the same row: the same chosen token, logprobs within
// 1e-4, the same top ids in the same order except where two of the host's neighbours tie
// within 1e-5 (then the device may list them the other way round).
void expect_close_logprobs(const TokenLogprobs& dev, const TokenLogprobs& host, int32_t top_n, const std::string& what) {
  EXPECT_EQ(dev.chosen.token, host.chosen.token) << what;
  EXPECT_NEAR(dev.chosen.logprob, host.chosen.logprob, 1e-4) << what << ": chosen";
  EXPECT_TRUE(std::isfinite(dev.chosen.logprob) && dev.chosen.logprob <= 0.0f) << what << ": " << dev.chosen.logprob;
  ASSERT_EQ(int32_t(host.top.size()), top_n) << what << ": the vocabulary holds more than top_logprobs ids";
  ASSERT_EQ(dev.top.size(), host.top.size()) << what;
  for (size_t j = 0; j < host.top.size(); ++j) {
    EXPECT_NEAR(dev.top[j].logprob, host.top[j].logprob, 1e-4) << what << ": top " << j;
    if (j > 0) {
      EXPECT_GE(dev.top[j - 1].logprob, dev.top[j].logprob) << what << ": top " << j << " out of order";
    }
    if (dev.top[j].token == host.top[j].token) continue;
    const float lp = host.top[j].logprob;
    const bool tie = (j > 0 && std::fabs(host.top[j - 1].logprob - lp) <= 1e-5f) ||
                     (j + 1 < host.top.size() && std::fabs(host.top[j + 1].logprob - lp) <= 1e-5f) ||
                     (j + 1 == host.top.size() && std::fabs(dev.top[j].logprob - lp) <= 1e-5f);
    EXPECT_TRUE(tie) << what << ": top " << j << " is id " << dev.top[j].token << " on the device, " << host.top[j].token
                     << " on the host (logprob " << lp << ")";
  }
}

// Every request asks for logprobs (top_logprobs 0, 5 and 20; greedy, seeded samplers, greedy
// with a logit bias). Three engines, one step at a time with the device's logprobs, overlapped
// with the device's logprobs, and one step at a time with the host's: max_tokens alone ends
// requests, so all three plan the same steps over the same logits bits. The overlapped engine
// gives the single steps' tokens and logprobs and overlaps most steps (requests with logprobs
// are not host-bound); the host's logprobs match within float rounding; greedy requests still
// take the argmax (their first top entry).
TEST_P(GpuEngineOverlap, DeviceLogprobsMatchHostLogprobs) {
  const std::string name = GetParam();
  std::vector<GenerationRequest> reqs = base_workload(31);
  const int32_t top_ns[3] = {0, 5, 20};
  for (size_t i = 0; i < reqs.size(); ++i) reqs[i].logprobs = top_ns[i % 3];
  auto single_engine = make_engine(name, false, false, true);
  auto overlap_engine = make_engine(name, true, false, true);
  auto host_engine = make_engine(name, false, false, false);
  ASSERT_NE(single_engine, nullptr);
  ASSERT_NE(overlap_engine, nullptr);
  ASSERT_NE(host_engine, nullptr);
  const RunResult single = run_workload(*single_engine, reqs, "");
  const RunResult overlap = run_workload(*overlap_engine, reqs, "");
  const RunResult host = run_workload(*host_engine, reqs, "");
  EXPECT_GT(overlap.stats.overlapped_steps, overlap.stats.steps / 2) << "requests with logprobs overlap";
  EXPECT_EQ(host.stats.overlapped_steps, 0);
  EXPECT_EQ(overlap.stats.steps, single.stats.steps) << "the same plans";
  int64_t checked = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerationRequest& q = reqs[i];
    const Outcome& s = single.out.at(q.id);
    const Outcome& o = overlap.out.at(q.id);
    const Outcome& h = host.out.at(q.id);
    ASSERT_EQ(s.reason, FinishReason::kLength) << q.id << ": " << s.message;
    ASSERT_EQ(o.reason, FinishReason::kLength) << q.id << ": " << o.message;
    ASSERT_EQ(h.reason, FinishReason::kLength) << q.id << ": " << h.message;
    ASSERT_EQ(s.tokens.size(), size_t(q.max_tokens)) << q.id;
    EXPECT_EQ(o.tokens, s.tokens) << q.id << ": overlapped and single steps differ";
    EXPECT_EQ(h.tokens, s.tokens) << q.id << ": device and host logprobs rows differ in tokens";
    ASSERT_EQ(s.logprobs.size(), s.tokens.size()) << q.id;
    ASSERT_EQ(o.logprobs.size(), s.tokens.size()) << q.id;
    ASSERT_EQ(h.logprobs.size(), h.tokens.size()) << q.id;
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      const std::string what = name + " " + q.id + " token " + std::to_string(t);
      const TokenLogprobs& a = s.logprobs[t];
      const TokenLogprobs& b = o.logprobs[t];
      EXPECT_EQ(a.chosen.token, s.tokens[t]) << what;
      if (t < o.tokens.size() && o.tokens[t] == s.tokens[t]) expect_close_logprobs(b, a, q.logprobs, what + " (overlapped)");
      if (t < h.tokens.size() && h.tokens[t] == s.tokens[t]) expect_close_logprobs(a, h.logprobs[t], q.logprobs, what);
      // Greedy without a bias: the argmax, which is the first top entry (or ties it).
      if (i % 4 == 0 && !a.top.empty()) {
        EXPECT_TRUE(a.top[0].token == s.tokens[t] || a.top[0].logprob == a.chosen.logprob)
            << what << ": greedy token " << s.tokens[t] << " is not the argmax " << a.top[0].token;
        EXPECT_EQ(a.chosen.logprob, a.top[0].logprob) << what;
      }
      ++checked;
    }
  }
  EXPECT_GT(checked, 200);
}

// A vocabulary of the model's width for grammars: the EOS ids are stop ids, one id is "@" (no
// other token holds that byte, so a grammar's "@" is a forced token), every other id one or two
// characters of a small alphabet.
std::shared_ptr<const grammar::Vocabulary> synthetic_vocab(const ModelConfig& cfg) {
  const std::string chars = "abcdefghij0123456789,;";
  std::vector<std::string> bytes;
  std::vector<int32_t> stops(cfg.eos_ids.begin(), cfg.eos_ids.end());
  bool at = false;
  for (int32_t id = 0; id < cfg.vocab_size; ++id) {
    if (std::find(stops.begin(), stops.end(), id) != stops.end()) {
      bytes.push_back("<eos" + std::to_string(id) + ">");
    } else if (!at && id >= int32_t(chars.size())) {
      bytes.push_back("@");
      at = true;
    } else if (id < int32_t(chars.size())) {
      bytes.push_back(std::string(1, chars[size_t(id)]));
    } else {
      bytes.push_back(std::string(1, chars[size_t(id) % 10]) + chars[size_t(id * 7) % chars.size()]);
    }
  }
  auto v = grammar::Vocabulary::create(std::move(bytes), stops, stops);
  EXPECT_TRUE(v.ok()) << (v.ok() ? "" : v.error().to_string());
  return v.ok() ? *v : nullptr;
}

TEST_P(GpuEngineOverlap, ConstrainedRowsMatchSingleStepsAndTheHostSampler) {
  const std::string name = GetParam();
  auto cfg = load_model_config(model_path(name));
  ASSERT_TRUE(cfg.ok());
  ASSERT_FALSE(cfg->eos_ids.empty());
  auto vocab = synthetic_vocab(*cfg);
  ASSERT_NE(vocab, nullptr);
  grammar::GrammarCache cache;
  // After each comma two "@" are forced: filled when steps run one at a time.
  const grammar::GrammarSpec spec{grammar::GrammarKind::kRegex, "(ab|c[0-9]+|d[e-j]*)(,@@(ab|c[0-9]+|d[e-j]*))*;", {}};
  auto masks = cache.get_masks(spec, vocab);
  ASSERT_TRUE(masks.ok()) << masks.error().to_string();
  std::vector<GenerationRequest> reqs = base_workload(47);
  int32_t constrained = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i % 3 == 2) continue;  // unconstrained neighbours in the same steps
    reqs[i].grammar = *masks;
    reqs[i].grammar_key = grammar::GrammarCache::key_of(spec);
    reqs[i].ignore_eos = false;
    reqs[i].max_tokens = 8 + int32_t(i % 6) * 8;
    ++constrained;
  }
  auto off_engine = make_engine(name, false, true);
  auto on_engine = make_engine(name, true, true);
  auto host_engine = make_engine(name, false, true, false, false);
  ASSERT_NE(off_engine, nullptr);
  ASSERT_NE(on_engine, nullptr);
  ASSERT_NE(host_engine, nullptr);
  const RunResult off = run_workload(*off_engine, reqs, "");
  const RunResult on = run_workload(*on_engine, reqs, "");
  const RunResult host = run_workload(*host_engine, reqs, "");
  expect_same(on, off, "", name + " overlapped");
  expect_same(host, off, "", name + " host sampler");
  EXPECT_EQ(off.stats.overlapped_steps, 0);
  EXPECT_GT(on.stats.overlapped_steps, on.stats.steps / 2) << on.stats.steps << " steps: constrained rows overlap";
  EXPECT_GT(on.stats.preemptions, 0) << "the small pool preempts";
  EXPECT_EQ(on.stats.fill_tokens, 0) << "overlapped steps do not fill";
  EXPECT_GT(off.stats.fill_tokens, 0) << "the grammar forces tokens (b after a): one step at a time fills them";
  int32_t ended = 0;
  for (const auto& q : reqs) {
    if (q.grammar == nullptr) continue;
    const Outcome& o = off.out.at(q.id);
    grammar::Matcher m(*masks, 0);
    for (int32_t t : o.tokens) ASSERT_TRUE(m.accept_token(t)) << name << " " << q.id << ": token " << t << " outside the grammar";
    if (o.reason == FinishReason::kStop) {
      EXPECT_TRUE(m.is_complete()) << name << " " << q.id;
      ++ended;
    } else {
      EXPECT_EQ(o.reason, FinishReason::kLength) << name << " " << q.id << ": " << o.message;
    }
  }
  std::printf("%s: %d constrained requests, %d ended by the grammar; %lld tokens filled one step at a time; "
              "%lld of %lld steps overlapped; %lld masks, mean %.4f ms\n",
              name.c_str(), constrained, ended, (long long)off.stats.fill_tokens, (long long)on.stats.overlapped_steps,
              (long long)on.stats.steps, (long long)on.stats.grammar_mask.count,
              on.stats.grammar_mask.sum_ms / double(std::max<int64_t>(1, on.stats.grammar_mask.count)));
  EXPECT_GT(ended, 0);
}

// gemma3-tiny: sliding-window layers paging in a pool of their own.
INSTANTIATE_TEST_SUITE_P(Models, GpuEngineOverlap, ::testing::Values("llama3-tiny", "qwen3-tiny", "gemma3-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

// Host and disk KV tiers, checkpoints every 8 tokens and (qwen35-tiny) recurrent-state
// snapshots (restored by prefix hits) with overlapped steps, batch-invariant kernels, the small
// pool (demotions and promotions while a step is in flight): the tokens of single steps with the same features, and
// most steps overlap. Then (full-attention and window models: a hybrid's resumed state comes
// from a prefill, whose arithmetic differs from the decodes') a run stopped mid-generation and
// a new engine over the same directories: the resumed requests give the uninterrupted tokens
// (a checkpoint taken while the next token's draw is out records the RNG from before it).
class GpuEngineDurableOverlap : public GpuEngineOverlap {};

TEST_P(GpuEngineDurableOverlap, TiersCheckpointsAndStateOverlapAndResume) {
  namespace fs = std::filesystem;
  const std::string name = GetParam();
  const bool hybrid = name.rfind("qwen35", 0) == 0;
  const fs::path root = fs::temp_directory_path() / ("strata_gpu_durable_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(root);
  int run = 0;
  fs::path dir;
  auto durable = [&](EngineOptions& o) {
    o.kv_host_bytes = int64_t(4) << 20;
    o.kv_disk_dir = dir.string();
    o.kv_disk_bytes = int64_t(256) << 20;
    o.checkpoint_every = 8;
    o.state_snapshot_interval = 64;
  };
  auto fresh = [&]() {
    dir = root / std::to_string(run++);
    fs::create_directories(dir);
  };
  std::vector<GenerationRequest> reqs = base_workload(61);
  if (hybrid) {
    // Shared prefixes past the first 64-token snapshot point: later requests restore its state.
    std::mt19937 rng(5);
    std::vector<int32_t> head(40);
    for (auto& t : head) t = 3 + int32_t(rng() % 500);
    for (size_t i = 0; i < reqs.size(); ++i) {
      if (i % 4 != 3) reqs[i].prompt.insert(reqs[i].prompt.begin(), head.begin(), head.end());
    }
  }
  fresh();
  auto off_engine = make_engine(name, false, true, true, true, durable);
  ASSERT_NE(off_engine, nullptr);
  const RunResult off = run_workload(*off_engine, reqs, "");
  fresh();
  auto on_engine = make_engine(name, true, true, true, true, durable);
  ASSERT_NE(on_engine, nullptr);
  const RunResult on = run_workload(*on_engine, reqs, "");
  expect_same(on, off, "", name + " durable");
  EXPECT_GT(on.stats.overlapped_steps, on.stats.steps / 2) << on.stats.steps << " steps";
  if (!hybrid) EXPECT_GT(on.stats.kv_tiers.demoted_blocks, 0) << "the small pool demotes";
  EXPECT_GT(on.stats.checkpoint_blocks.staged, 0);
  EXPECT_GT(on.stats.checkpoints.written, 0);
  if (hybrid) EXPECT_GT(on.stats.state_snapshots.restores, 0);
  std::printf("%s durable: %lld of %lld steps overlapped, %lld blocks demoted, %lld checkpoints written, %lld checkpoint "
              "blocks staged, %lld handed, %lld dropped, max gap %lld tokens\n",
              name.c_str(), (long long)on.stats.overlapped_steps, (long long)on.stats.steps,
              (long long)on.stats.kv_tiers.demoted_blocks, (long long)on.stats.checkpoints.written,
              (long long)on.stats.checkpoint_blocks.staged, (long long)on.stats.checkpoint_blocks.handed,
              (long long)on.stats.checkpoint_blocks.dropped, (long long)on.stats.checkpoints.max_gap_tokens);
  on_engine.reset();
  off_engine.reset();
  if (hybrid) {
    fs::remove_all(root);
    return;
  }

  // Six long requests (seeded sampling and greedy) stopped once each has 20 tokens.
  std::vector<GenerationRequest> longs;
  for (size_t i = 0; i < 6; ++i) {
    GenerationRequest r = reqs[i];
    r.id = "long" + std::to_string(i);
    r.max_tokens = 96;
    r.sampling.logit_bias.clear();
    longs.push_back(std::move(r));
  }
  auto ref_engine = make_engine(name, false, true);
  ASSERT_NE(ref_engine, nullptr);
  const RunResult ref = run_workload(*ref_engine, longs, "");
  ref_engine.reset();
  fresh();
  {
    auto e = make_engine(name, true, true, true, true, durable);
    ASSERT_NE(e, nullptr);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& q : longs) {
      auto s = e->submit(q);
      ASSERT_TRUE(s.ok());
      streams.push_back(*s);
    }
    e->start();
    for (auto& s : streams) {
      size_t n = 0;
      while (n < 20) {
        auto ev = s->next(std::chrono::seconds(120));
        ASSERT_TRUE(ev.has_value()) << s->id() << " timed out";
        n += ev->tokens.size();
        if (ev->final) break;
      }
    }
    e->shutdown();
  }
  auto e = make_engine(name, true, true, true, true, durable);
  ASSERT_NE(e, nullptr);
  e->start();
  int resumed = 0;
  for (const auto& q : longs) {
    auto s = e->submit(q);
    ASSERT_TRUE(s.ok());
    std::vector<int32_t> tokens;
    size_t first = 0;
    for (;;) {
      auto ev = (*s)->next(std::chrono::seconds(120));
      ASSERT_TRUE(ev.has_value()) << q.id << " timed out";
      if (first == 0) first = ev->tokens.size();
      tokens.insert(tokens.end(), ev->tokens.begin(), ev->tokens.end());
      if (ev->final) break;
    }
    EXPECT_EQ(tokens, ref.out.at(q.id).tokens) << name << " " << q.id << " resumed from " << first << " tokens";
    if (first >= 8) ++resumed;
  }
  EXPECT_GT(resumed, 0) << "no request resumed from a checkpoint";
  EXPECT_GT(e->stats().kv_tiers.disk_hit_blocks, 0) << "the checkpointed KV came from disk";
  e->shutdown();
  e.reset();
  fs::remove_all(root);
}

INSTANTIATE_TEST_SUITE_P(Models, GpuEngineDurableOverlap, ::testing::Values("llama3-tiny", "gemma3-tiny", "qwen35-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace strata::cuda
