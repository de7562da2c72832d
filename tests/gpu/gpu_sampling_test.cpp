// The CUDA sampler (backend/cuda/sampling.h) against the host Sampler on fresh random rows:
// random logits (bf16-rounded rows full of ties, -inf, NaN, huge values, +inf) and random
// parameter mixes. Greedy tokens must equal the host's; a sampled token must be in the
// reference's kept set and, with the same draw, equal the host's token unless the draw lies
// within 1e-5 of a boundary of the cumulative distribution (counted, and must be rare); the
// kept distribution and the logprobs must be within 1e-5 of Sampler::distribution and
// Sampler::logprobs. The benchmark test prints the time of a 256 x 128256 batch. Needs a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "backend/cuda/sampling.h"
#include "gpu_test_util.h"
#include "runtime/cuda/device_logprobs.h"
#include "sampling/sampler.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr double kTol = 1e-5;

// One row of a test batch: its logits, the host's two identical samplers (one samples, one
// hands its draw to the device) and what the device is told.
struct Case {
  std::vector<float> logits;
  SamplingParams params;
  std::optional<Sampler> ref;     // sample(), distribution(), logprobs()
  std::optional<Sampler> twin;    // next_draw(), penalty lists
  SamplingRow row;
  bool has_pos_inf = false;
  std::vector<uint32_t> mask;  // a grammar mask (words of mask_ids ids), or empty
  int32_t mask_ids = 0;
  const TokenMask* host_mask() const {
    tm = TokenMask{mask.data(), mask_ids};
    return mask.empty() ? nullptr : &tm;
  }
  mutable TokenMask tm;
};

struct Batch {
  std::vector<SamplingRow> rows;
  std::vector<int32_t> bias_ids, seen_ids, count_ids, count_values;
  std::vector<float> bias_values;
  std::vector<uint32_t> masks;  // [masked rows, (vocab + 31) / 32]
  int32_t masked_rows = 0;
};

// A grammar mask for a row (about a third of rows): a few ids, most ids, one id, or most of
// a shorter vocabulary, always with one id whose raw logit is finite (a bias or penalty keeps
// it finite), so the row has a token.
void random_mask(std::mt19937& rng, int32_t vocab, Case* c, Batch* batch) {
  if (rng() % 3 != 0) return;
  const int kind = int(rng() % 4);
  const int32_t words = (vocab + 31) / 32;
  c->mask_ids = kind == 3 ? std::max(1, vocab - int32_t(rng() % 40) - 1) : vocab;
  c->mask.assign(size_t(words), 0u);
  auto allow = [&](int32_t id) { c->mask[size_t(id >> 5)] |= 1u << (id & 31); };
  const int32_t n = c->mask_ids;
  if (kind == 0) {
    for (int j = 1 + int(rng() % 20); j > 0; --j) allow(int32_t(rng() % uint32_t(n)));
  } else if (kind == 1 || kind == 3) {
    for (int32_t id = 0; id < n; ++id) {
      if (rng() % 10 < 7) allow(id);
    }
  }
  int32_t finite = int32_t(rng() % uint32_t(n));
  for (int32_t k = 0; k < n && !std::isfinite(c->logits[size_t(finite)]); ++k) finite = (finite + 1) % n;
  allow(finite);
  c->row.mask = batch->masked_rows++;
  batch->masks.insert(batch->masks.end(), c->mask.begin(), c->mask.end());
}

std::vector<float> random_logits(std::mt19937& rng, int32_t vocab, bool* has_pos_inf) {
  std::uniform_int_distribution<int> kind_d(0, 9);
  const int kind = kind_d(rng);
  std::normal_distribution<float> nd(0.0f, kind < 3 ? 1.0f : 3.0f);
  std::vector<float> l(vocab);
  for (auto& x : l) x = nd(rng);
  std::uniform_int_distribution<int32_t> id(0, vocab - 1);
  if (kind % 2 == 0) {
    for (auto& x : l) x = bf16_to_f32(f32_to_bf16(x));  // few distinct values: ties everywhere
  }
  if (kind == 1) {
    for (auto& x : l) x = std::round(x);  // coarse: huge tie groups, ties at the maximum
  }
  const int n_special = vocab / 100;
  for (int j = 0; j < n_special; ++j) l[id(rng)] = -kInf;
  for (int j = 0; j < n_special; ++j) l[id(rng)] = std::numeric_limits<float>::quiet_NaN();
  if (kind == 3) {
    for (int j = 0; j < 8; ++j) l[id(rng)] = (j % 2 ? -1.0f : 1.0f) * 1e30f;
    for (int j = 0; j < 8; ++j) l[id(rng)] = 1e-30f;
  }
  if (kind == 5) {
    // a few strong tokens: a peaked distribution, as a trained model gives
    for (int j = 0; j < 4; ++j) l[id(rng)] = 12.0f + float(j);
  }
  *has_pos_inf = false;
  if (kind == 7) {
    l[id(rng)] = kInf;
    l[id(rng)] = kInf;
    *has_pos_inf = true;
  }
  return l;
}

SamplingParams random_params(std::mt19937& rng, int32_t vocab) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  auto chance = [&](float p) { return u(rng) < p; };
  SamplingParams p;
  p.seed = rng();
  p.has_seed = true;
  if (chance(0.15f)) {
    p.temperature = 0.0f;
  } else if (chance(0.05f)) {
    p.temperature = 1e-30f;  // the maximum overflows: the host's limit rule
  } else {
    p.temperature = 0.05f + 2.0f * u(rng);
  }
  if (chance(0.35f)) {
    const int32_t ks[] = {1, 2, 5, 50, 1000, vocab / 2, vocab - 1, vocab + 7};
    p.top_k = std::min(ks[rng() % 8], vocab + 7);
  }
  if (chance(0.4f)) {
    const float ps[] = {0.05f, 0.5f, 0.9f, 0.95f, 0.999f};
    p.top_p = chance(0.5f) ? ps[rng() % 5] : 0.01f + 0.98f * u(rng);
  }
  if (chance(0.25f)) {
    const float ms[] = {1e-4f, 0.01f, 0.05f, 0.2f, 1.0f};
    p.min_p = ms[rng() % 5];
  }
  if (chance(0.3f)) p.repetition_penalty = 0.7f + 0.8f * u(rng);
  if (chance(0.3f)) p.presence_penalty = -2.0f + 4.0f * u(rng);
  if (chance(0.3f)) p.frequency_penalty = -2.0f + 4.0f * u(rng);
  if (chance(0.2f)) p.vocab_limit = std::max(1, vocab - int32_t(rng() % 300));
  if (chance(0.3f)) {
    const int32_t limit = p.vocab_limit > 0 ? p.vocab_limit : vocab;
    const int n_bias = 1 + int(rng() % 6);
    for (int j = 0; j < n_bias; ++j) {
      const int32_t id = int32_t(rng() % uint32_t(limit));
      p.logit_bias.emplace_back(id, -100.0f + 200.0f * u(rng));
      if (j == 0 && chance(0.5f)) p.logit_bias.emplace_back(id, 3.0f);  // a repeated id adds up
    }
  }
  return p;
}

// Builds a case: samplers with a random history (prompt + accepted tokens), the device row.
void make_case(std::mt19937& rng, int32_t vocab, Case* c, Batch* batch) {
  c->logits = random_logits(rng, vocab, &c->has_pos_inf);
  c->params = random_params(rng, vocab);
  std::vector<int32_t> prompt(rng() % 200);
  for (auto& t : prompt) t = int32_t(rng() % uint32_t(vocab));
  std::vector<int32_t> generated(rng() % 100);
  for (auto& t : generated) t = int32_t(rng() % 64);  // small ids: repeats, counts > 1
  for (auto* s : {&c->ref, &c->twin}) {
    auto made = Sampler::create(c->params, vocab, prompt);
    ASSERT_TRUE(made.ok()) << made.error().to_string();
    s->emplace(std::move(*made));
    for (int32_t t : generated) (*s)->accept(t);
  }
  SamplingRow r = sampling_row(c->params);
  if (!c->params.greedy()) r.draw = c->twin->next_draw();
  r.bias_begin = int32_t(batch->bias_ids.size());
  r.bias_count = int32_t(c->params.logit_bias.size());
  for (const auto& [id, v] : c->params.logit_bias) {
    batch->bias_ids.push_back(id);
    batch->bias_values.push_back(v);
  }
  const auto seen = c->twin->seen_ids();
  r.seen_begin = int32_t(batch->seen_ids.size());
  r.seen_count = int32_t(seen.size());
  batch->seen_ids.insert(batch->seen_ids.end(), seen.begin(), seen.end());
  const auto counts = c->twin->token_counts();
  r.counts_begin = int32_t(batch->count_ids.size());
  r.counts_count = int32_t(counts.size());
  for (const auto& [id, n] : counts) {
    batch->count_ids.push_back(id);
    batch->count_values.push_back(n);
  }
  r.top_logprobs = c->has_pos_inf ? -1 : int32_t(rng() % 23) - 2;  // -2, -1: none
  if (r.top_logprobs < 0) r.top_logprobs = -1;
  c->row = r;
  const int32_t limit = c->params.vocab_limit > 0 ? std::min(vocab, c->params.vocab_limit) : vocab;
  if (limit == vocab) random_mask(rng, vocab, c, batch);  // (within a vocab limit the mask may allow none)
  batch->rows.push_back(c->row);
}

template <class T>
T* upload(DeviceBuffer<T>& buf, const std::vector<T>& v) {
  if (!v.empty()) buf.upload(v);
  return buf.p;
}

struct DeviceResult {
  std::vector<int32_t> tokens, top_ids;
  std::vector<float> chosen, top_lp, probs;
};

// Runs one launch over the cases' rows.
DeviceResult run_device(const std::vector<Case>& cases, const Batch& batch, int32_t vocab, int repeats = 1) {
  const int32_t n_rows = int32_t(cases.size());
  std::vector<float> logits(size_t(n_rows) * vocab);
  for (int32_t r = 0; r < n_rows; ++r) std::copy(cases[r].logits.begin(), cases[r].logits.end(), logits.begin() + size_t(r) * vocab);
  DeviceBuffer<float> d_logits(logits.size());
  d_logits.upload(logits);
  DeviceBuffer<SamplingRow> d_rows(batch.rows.size());
  DeviceBuffer<int32_t> d_bias_ids(batch.bias_ids.size()), d_seen(batch.seen_ids.size()),
      d_count_ids(batch.count_ids.size()), d_count_values(batch.count_values.size());
  DeviceBuffer<float> d_bias_values(batch.bias_values.size());
  DeviceBuffer<uint32_t> d_masks(batch.masks.size());
  DeviceBuffer<int32_t> d_tokens(n_rows), d_top_ids(size_t(n_rows) * kSamplingMaxTopLogprobs);
  DeviceBuffer<float> d_chosen(n_rows), d_top_lp(size_t(n_rows) * kSamplingMaxTopLogprobs), d_probs(size_t(n_rows) * vocab);
  DeviceBuffer<uint8_t> d_ws(sampling_workspace_bytes(n_rows, vocab));
  d_ws.poison();
  d_tokens.poison();
  d_probs.poison();
  SamplingBatch b;
  b.logits = d_logits.p;
  b.logits_stride = vocab;
  b.n_rows = n_rows;
  b.vocab = vocab;
  b.rows = upload(d_rows, batch.rows);
  b.bias_ids = upload(d_bias_ids, batch.bias_ids);
  b.bias_values = upload(d_bias_values, batch.bias_values);
  b.seen_ids = upload(d_seen, batch.seen_ids);
  b.count_ids = upload(d_count_ids, batch.count_ids);
  b.count_values = upload(d_count_values, batch.count_values);
  b.masks = upload(d_masks, batch.masks);
  b.mask_words = (vocab + 31) / 32;
  b.tokens = d_tokens.p;
  b.chosen_logprob = d_chosen.p;
  b.top_ids = d_top_ids.p;
  b.top_logprob = d_top_lp.p;
  b.probs = d_probs.p;
  b.workspace = d_ws.p;
  b.workspace_bytes = d_ws.n;
  DeviceResult out;
  for (int k = 0; k < repeats; ++k) {
    launch_sampling(b, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cudaGetErrorString(cudaGetLastError());
    std::vector<int32_t> tokens = d_tokens.download();
    if (k > 0) {
      EXPECT_EQ(tokens, out.tokens) << "a second launch on the same rows gave other tokens";
    }
    out.tokens = tokens;
  }
  out.top_ids = d_top_ids.download();
  out.chosen = d_chosen.download();
  out.top_lp = d_top_lp.download();
  out.probs = d_probs.download();
  return out;
}

bool close(float a, float b) {
  if (std::isinf(a) || std::isinf(b)) return a == b;
  return std::fabs(double(a) - double(b)) <= kTol;
}

// The host's draw order: probability order with top-k, or min-p without top-p; else ids.
bool host_walks_by_probability(const SamplingParams& p, int32_t n) {
  const bool top_k = p.top_k > 0 && p.top_k < n;
  return top_k || (p.min_p > 0.0f && p.top_p >= 1.0f);
}

// Distance from u to the nearest boundary of the running sum of probs in the host's order.
double boundary_distance(const std::vector<float>& probs, int32_t n, bool by_probability, double u) {
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  if (by_probability) {
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return probs[a] > probs[b]; });
  }
  double cum = 0.0, best = std::fabs(u);
  for (int32_t i : order) {
    if (probs[i] <= 0.0f) continue;
    cum += probs[i];
    best = std::min(best, std::fabs(u - cum));
  }
  return best;
}

struct Tally {
  int greedy = 0, sampled = 0, near_boundary = 0, logprob_rows = 0, masked = 0;
};

void check_cases(std::vector<Case>& cases, const Batch& batch, int32_t vocab, Tally* tally) {
  const DeviceResult dev = run_device(cases, batch, vocab, 2);
  std::vector<float> ref_probs(vocab);
  for (size_t r = 0; r < cases.size(); ++r) {
    Case& c = cases[r];
    const int32_t n = c.ref->effective_vocab(vocab);
    const int32_t got = dev.tokens[r];
    c.ref->distribution(c.logits.data(), vocab, ref_probs.data(), c.host_mask());
    Sampler host = *c.ref;  // a copy, so the case can be checked again with the same draw
    const int32_t want = host.sample(c.logits.data(), vocab, c.host_mask());
    if (!c.mask.empty()) {
      ++tally->masked;
      EXPECT_TRUE(got < c.mask_ids && ((c.mask[size_t(got >> 5)] >> (got & 31)) & 1u)) << "token " << got << " outside the mask";
    }
    SCOPED_TRACE("row " + std::to_string(r) + " vocab " + std::to_string(vocab) + " T " +
                 std::to_string(c.params.temperature) + " top_k " + std::to_string(c.params.top_k) + " top_p " +
                 std::to_string(c.params.top_p) + " min_p " + std::to_string(c.params.min_p) + " limit " +
                 std::to_string(c.params.vocab_limit));
    ASSERT_GE(got, 0);
    ASSERT_LT(got, n);
    if (c.params.greedy()) {
      ++tally->greedy;
      EXPECT_EQ(got, want) << "greedy token";
    } else {
      ++tally->sampled;
      EXPECT_GT(ref_probs[got], 0.0f) << "token " << got << " is outside the reference's kept set";
      if (got != want) {
        const double u = double(c.row.draw >> 11) * 0x1.0p-53;
        const double d = boundary_distance(ref_probs, n, host_walks_by_probability(c.params, n), u);
        EXPECT_LE(d, kTol) << "device token " << got << ", host token " << want << " with the same draw (u " << u << ")";
        ++tally->near_boundary;
      }
    }
    double max_err = 0.0;
    const float* probs = dev.probs.data() + r * size_t(vocab);
    for (int32_t i = 0; i < vocab; ++i) max_err = std::max(max_err, std::fabs(double(probs[i]) - double(ref_probs[i])));
    EXPECT_LE(max_err, kTol) << "kept distribution";

    if (c.row.top_logprobs >= 0) {
      ++tally->logprob_rows;
      TokenLogprobs ref_lp;
      ASSERT_TRUE(c.ref->logprobs(c.logits.data(), vocab, got, c.row.top_logprobs, &ref_lp).ok());
      EXPECT_TRUE(close(dev.chosen[r], ref_lp.chosen.logprob)) << dev.chosen[r] << " vs " << ref_lp.chosen.logprob;
      const int32_t* ids = dev.top_ids.data() + r * kSamplingMaxTopLogprobs;
      const float* lps = dev.top_lp.data() + r * kSamplingMaxTopLogprobs;
      for (int j = 0; j < kSamplingMaxTopLogprobs; ++j) {
        if (j >= int(ref_lp.top.size())) {
          EXPECT_EQ(ids[j], -1) << "top entry " << j << " past top_n";
          continue;
        }
        EXPECT_TRUE(close(lps[j], ref_lp.top[j].logprob)) << "top " << j << ": " << lps[j] << " vs " << ref_lp.top[j].logprob;
        if (ids[j] != ref_lp.top[j].token) {
          // Only two logprobs within rounding of each other may trade places.
          auto it = std::find_if(ref_lp.top.begin(), ref_lp.top.end(), [&](const TokenLogprob& t) { return t.token == ids[j]; });
          ASSERT_NE(it, ref_lp.top.end()) << "top " << j << ": id " << ids[j] << " is not in the reference's list";
          EXPECT_TRUE(close(it->logprob, ref_lp.top[j].logprob)) << "top " << j << " ids " << ids[j] << " vs " << ref_lp.top[j].token;
        }
      }
    }
  }
}

class GpuSampling : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
    rng_.seed(fresh_seed());
  }
  std::mt19937 rng_;
};

// Random rows of several widths; compact: set_sampling_compact.
void random_rows_match(std::mt19937& rng, bool compact) {
  set_sampling_compact(compact);
  Tally tally;
  struct Shape {
    int32_t vocab, rows, repeats;
  };
  for (const Shape s : {Shape{1000, 200, 3}, Shape{37, 100, 2}, Shape{128256, 48, 2}, Shape{kSamplingMaxVocab, 8, 1}}) {
    for (int rep = 0; rep < s.repeats; ++rep) {
      std::vector<Case> cases(s.rows);
      Batch batch;
      for (auto& c : cases) {
        make_case(rng, s.vocab, &c, &batch);
        if (::testing::Test::HasFatalFailure()) return;
      }
      check_cases(cases, batch, s.vocab, &tally);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  set_sampling_compact(true);
  std::printf("compact path %s: greedy rows %d, sampled rows %d (token differs from the host's within 1e-5 of a "
              "boundary: %d), logprob rows %d, grammar-masked rows %d\n",
              compact ? "on" : "off", tally.greedy, tally.sampled, tally.near_boundary, tally.logprob_rows, tally.masked);
  EXPECT_GT(tally.sampled, 0);
  EXPECT_GT(tally.masked, 0);
  // Boundary cases need a draw within 1e-5 of a cumulative mass boundary: a few per thousand
  // at most with these row counts.
  EXPECT_LE(tally.near_boundary * 100, tally.sampled);
}

TEST_F(GpuSampling, MatchesHostSamplerOnRandomRows) { random_rows_match(rng_, true); }
TEST_F(GpuSampling, MatchesHostSamplerWithoutCompactPath) { random_rows_match(rng_, false); }

// Rows built to hit each rule on its own: every logit equal, ties at the maximum with top-k 1,
// min-p 1, a tiny nucleus, the temperature limit, penalties that move the maximum.
TEST_F(GpuSampling, EdgeRows) {
  const int32_t vocab = 5000;
  std::vector<Case> cases;
  Batch batch;
  auto add = [&](std::vector<float> logits, SamplingParams p) {
    Case c;
    c.logits = std::move(logits);
    c.params = p;
    for (auto* s : {&c.ref, &c.twin}) {
      auto made = Sampler::create(p, vocab, std::vector<int32_t>{3, 3, 7});
      ASSERT_TRUE(made.ok()) << made.error().to_string();
      s->emplace(std::move(*made));
      (*s)->accept(7);
      (*s)->accept(7);
      (*s)->accept(9);
    }
    SamplingRow r = sampling_row(p);
    if (!p.greedy()) r.draw = c.twin->next_draw();
    r.bias_begin = int32_t(batch.bias_ids.size());
    r.bias_count = int32_t(p.logit_bias.size());
    for (const auto& [id, v] : p.logit_bias) {
      batch.bias_ids.push_back(id);
      batch.bias_values.push_back(v);
    }
    r.seen_begin = int32_t(batch.seen_ids.size());
    r.seen_count = int32_t(c.twin->seen_ids().size());
    for (int32_t id : c.twin->seen_ids()) batch.seen_ids.push_back(id);
    r.counts_begin = int32_t(batch.count_ids.size());
    r.counts_count = int32_t(c.twin->token_counts().size());
    for (const auto& [id, n] : c.twin->token_counts()) {
      batch.count_ids.push_back(id);
      batch.count_values.push_back(n);
    }
    r.top_logprobs = 5;
    c.row = r;
    batch.rows.push_back(r);
    cases.push_back(std::move(c));
  };
  for (uint64_t seed = 0; seed < 8; ++seed) {
    std::vector<float> flat(vocab, 0.5f);
    std::vector<float> tied(vocab, -3.0f);
    for (int i = 100; i < vocab; i += 97) tied[i] = 4.0f;  // many tokens tied at the maximum
    SamplingParams p;
    p.seed = seed * 7919 + 1;
    p.has_seed = true;
    p.temperature = 0.0f;
    add(tied, p);  // greedy: the lowest tied id
    p.temperature = 1.0f;
    add(flat, p);
    p.top_k = 1;
    add(tied, p);  // top-k 1 keeps every token tied at the k-th value
    p.top_k = 0;
    p.min_p = 1.0f;
    add(tied, p);
    p.min_p = 0.0f;
    p.top_p = 1e-6f;
    add(tied, p);  // the nucleus is one token of the tied group (the lowest id)
    add(flat, p);
    p.top_p = 1.0f;
    p.temperature = 1e-38f;
    add(tied, p);  // the limit rule: uniform over the tied maximum
    p.temperature = 0.8f;
    p.repetition_penalty = 3.0f;
    p.presence_penalty = 2.0f;
    p.frequency_penalty = 1.5f;
    std::vector<float> pen(vocab, -5.0f);
    pen[3] = 6.0f;
    pen[7] = 6.0f;
    pen[9] = 5.9f;
    pen[11] = 1.0f;
    p.logit_bias = {{11, 2.0f}, {11, 2.5f}};
    add(pen, p);
    p.temperature = 0.0f;
    add(pen, p);
  }
  for (bool compact : {true, false}) {
    SCOPED_TRACE(compact ? "compact path on" : "compact path off");
    set_sampling_compact(compact);
    Tally tally;
    check_cases(cases, batch, vocab, &tally);
  }
  set_sampling_compact(true);
}

// Time of one launch for 256 rows x 128256 (Llama 3 vocabulary), per parameter mix.
TEST_F(GpuSampling, Benchmark256x128256) {
  const int32_t vocab = 128256, n_rows = 256;
  std::normal_distribution<float> nd(0.0f, 2.5f);
  std::vector<float> logits(size_t(n_rows) * vocab);
  for (auto& x : logits) x = nd(rng_);
  DeviceBuffer<float> d_logits(logits.size());
  d_logits.upload(logits);
  DeviceBuffer<SamplingRow> d_rows(n_rows);
  DeviceBuffer<int32_t> d_tokens(n_rows), d_top_ids(size_t(n_rows) * kSamplingMaxTopLogprobs);
  DeviceBuffer<float> d_chosen(n_rows), d_top_lp(size_t(n_rows) * kSamplingMaxTopLogprobs);
  DeviceBuffer<uint8_t> d_ws(sampling_workspace_bytes(n_rows, vocab));
  struct Mix {
    const char* name;
    SamplingParams p;
    int32_t top_logprobs;
  };
  std::vector<Mix> mixes;
  SamplingParams p;
  p.temperature = 0.0f;
  mixes.push_back({"greedy", p, -1});
  mixes.push_back({"greedy + 5 logprobs", p, 5});
  p.temperature = 1.0f;
  mixes.push_back({"temperature 1", p, -1});
  p.temperature = 0.7f;
  p.top_k = 50;
  mixes.push_back({"T 0.7, top-k 50", p, -1});
  p.top_p = 0.9f;
  mixes.push_back({"T 0.7, top-k 50, top-p 0.9", p, -1});
  p.top_k = 0;
  p.top_p = 0.95f;
  mixes.push_back({"T 0.7, top-p 0.95", p, -1});
  p.top_p = 1.0f;
  p.min_p = 0.05f;
  mixes.push_back({"T 0.7, min-p 0.05", p, -1});
  p.min_p = 0.0f;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.1f;
  mixes.push_back({"T 0.7, top-p 0.9, repetition 1.1 + 20 logprobs", p, 20});
  std::vector<int32_t> seen(512);
  for (size_t i = 0; i < seen.size(); ++i) seen[i] = int32_t(i * 211 % vocab);
  DeviceBuffer<int32_t> d_seen(seen.size());
  d_seen.upload(seen);
  cudaEvent_t start, stop;
  ASSERT_CUDA_OK(cudaEventCreate(&start));
  ASSERT_CUDA_OK(cudaEventCreate(&stop));
  for (const Mix& mix : mixes) {
    std::vector<SamplingRow> rows(n_rows);
    for (int32_t r = 0; r < n_rows; ++r) {
      rows[r] = sampling_row(mix.p);
      rows[r].draw = uint64_t(rng_()) << 32 | rng_();
      rows[r].top_logprobs = mix.top_logprobs;
      if (mix.p.repetition_penalty != 1.0f) rows[r].seen_count = int32_t(seen.size());
    }
    d_rows.upload(rows);
    SamplingBatch b;
    b.logits = d_logits.p;
    b.logits_stride = vocab;
    b.n_rows = n_rows;
    b.vocab = vocab;
    b.rows = d_rows.p;
    b.seen_ids = d_seen.p;
    b.tokens = d_tokens.p;
    b.chosen_logprob = d_chosen.p;
    b.top_ids = d_top_ids.p;
    b.top_logprob = d_top_lp.p;
    b.workspace = d_ws.p;
    b.workspace_bytes = d_ws.n;
    for (bool compact : {true, false}) {
      set_sampling_compact(compact);
      for (int w = 0; w < 3; ++w) launch_sampling(b, nullptr);
      constexpr int kIters = 20;
      ASSERT_CUDA_OK(cudaEventRecord(start));
      for (int it = 0; it < kIters; ++it) launch_sampling(b, nullptr);
      ASSERT_CUDA_OK(cudaEventRecord(stop));
      ASSERT_CUDA_OK(cudaEventSynchronize(stop));
      float ms = 0.0f;
      ASSERT_CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
      std::printf("sampling %d x %d, %-48s compact %-3s %8.1f us per launch\n", n_rows, vocab, mix.name,
                  compact ? "on" : "off", 1000.0f * ms / kIters);
      const std::vector<int32_t> tokens = d_tokens.download();
      for (int32_t t : tokens) ASSERT_TRUE(t >= 0 && t < vocab) << mix.name << ": token " << t;
    }
  }
  set_sampling_compact(true);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

}  // namespace
}  // namespace strata::cuda
