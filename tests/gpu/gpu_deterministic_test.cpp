// CudaModelOptions::deterministic: one sequence's logits, bit for bit, do not depend on the
// other sequences sharing its steps. The sequence (a golden prompt of 33 tokens, then 16
// teacher-forced decode tokens) runs alone, then inside batches with 3, 7 and 33 other
// sequences of different prompt lengths that join at staggered steps and prefill in chunks, so
// its steps are mixed prefill/decode first and all-decode later (replayed from CUDA graphs), and
// its row moves within the batch. In deterministic mode every one of its 17 logit rows must
// equal the lone run's (memcmp); the default mode's differences are printed, not asserted (it
// picks GEMV, fused decode, split counts and kernels by batch shape). qwen3moe-tiny adds the
// sparse FFN (router GEMM, grouped expert GEMMs whose rows depend on how many tokens share an
// expert). Needs a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "gpu_test_util.h"
#include "runtime/cuda/cuda_model.h"

namespace strata::cuda {
namespace {

using namespace strata::gpu_test;

constexpr int32_t kDecodeSteps = 16;
constexpr int32_t kBlocksPerSeq = 16;  // 256 positions per sequence
constexpr int32_t kMaxOthers = 33;

struct Target {
  std::vector<int32_t> prompt;
  std::vector<int32_t> decode;  // kDecodeSteps tokens fed one per step
  std::vector<float> last_logits;  // the oracle's logits after the prompt
};

Target target_for(const std::string& model) {
  std::ifstream in(source_dir() + "/tests/data/reference/logits.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const auto j = nlohmann::json::parse(ss.str());
  const auto& c = j.at(model).at("cases").at(2);
  Target t;
  t.prompt = c.at("prompt_ids").get<std::vector<int32_t>>();
  const auto greedy = c.at("greedy_ids").get<std::vector<int32_t>>();
  for (int32_t i = 0; i < kDecodeSteps; ++i) t.decode.push_back(greedy.at(size_t(i) % greedy.size()));
  t.last_logits = c.at("last_logits").get<std::vector<float>>();
  return t;
}

CudaModelOptions options(bool deterministic) {
  CudaModelOptions o;
  o.deterministic = deterministic;
  o.kv_cache_bytes = int64_t(64) << 20;
  o.block_size = 16;
  o.max_tokens = 2048;
  o.max_seqs = kMaxOthers + 1;
  o.max_blocks_per_seq = kBlocksPerSeq;
  o.max_logit_rows = kMaxOthers + 1;
  return o;
}

// Another sequence of the batch: its prompt prefills in chunks from step `start`, then it
// decodes (fixed tokens) until the target is done.
struct Other {
  std::vector<int32_t> prompt;
  int32_t chunk = 1;
  int32_t start = 0;  // step index (the target's prefill is step 0; negative: before it)
  int32_t done = 0;   // tokens fed so far
  int32_t first_block = 0;
};

std::vector<Other> make_others(int32_t n, int32_t vocab) {
  std::mt19937 rng(1234u + uint32_t(n));
  std::vector<Other> out(static_cast<size_t>(n));
  for (int32_t j = 0; j < n; ++j) {
    Other& o = out[size_t(j)];
    const int32_t len = 1 + (j * 37 + 11) % 120;
    for (int32_t i = 0; i < len; ++i) o.prompt.push_back(int32_t(rng() % uint32_t(vocab)));
    o.chunk = 8 + (j * 13) % 40;
    o.start = j % 5 - 2;
    o.first_block = (j + 1) * kBlocksPerSeq;  // the target holds blocks [0, kBlocksPerSeq)
  }
  return out;
}

SeqSpan span_of(int32_t first_block, int32_t pos0, int32_t n_tokens) {
  SeqSpan s;
  for (int32_t b = 0; b < kBlocksPerSeq; ++b) s.block_table.push_back(first_block + b);
  s.pos0 = pos0;
  s.n_tokens = n_tokens;
  return s;
}

// Adds other o's tokens of this step (none before its start).
void add_other(Other& o, int32_t step, StepBatch* b) {
  if (step < o.start) return;
  const int32_t plen = int32_t(o.prompt.size());
  int32_t n = 1;
  std::vector<int32_t> toks;
  if (o.done < plen) {
    n = std::min(o.chunk, plen - o.done);
    toks.assign(o.prompt.begin() + o.done, o.prompt.begin() + o.done + n);
  } else {
    toks.push_back(int32_t((o.done * 7 + 3) % 500));
  }
  b->seqs.push_back(span_of(o.first_block, o.done, n));
  b->tokens.insert(b->tokens.end(), toks.begin(), toks.end());
  o.done += n;
}

// The target's 1 + kDecodeSteps logit rows, [steps, vocab], with n_others others around it.
std::vector<float> run_target(CudaDecoder& m, const Target& t, int32_t n_others, int* mixed_steps, int* decode_steps) {
  const int32_t vocab = m.config().vocab_size;
  auto others = make_others(n_others, vocab);
  std::vector<float> rows;
  std::vector<float> logits(size_t(vocab) * size_t(kMaxOthers + 1));
  std::vector<int32_t> am(kMaxOthers + 1);
  *mixed_steps = *decode_steps = 0;
  int32_t pos = 0;
  for (int32_t step = -2; step <= kDecodeSteps; ++step) {
    StepBatch b;
    // The target's place among the others moves from step to step.
    const int32_t place = step < 0 ? -1 : (step * 5) % (n_others + 1);
    int32_t row = -1;
    for (int32_t j = 0; j <= n_others; ++j) {
      if (j == place) {
        row = int32_t(b.seqs.size());
        if (step == 0) {
          b.seqs.push_back(span_of(0, 0, int32_t(t.prompt.size())));
          b.tokens.insert(b.tokens.end(), t.prompt.begin(), t.prompt.end());
          pos = int32_t(t.prompt.size());
        } else {
          b.seqs.push_back(span_of(0, pos, 1));
          b.tokens.push_back(t.decode[size_t(step - 1)]);
          ++pos;
        }
      }
      if (j < n_others) add_other(others[size_t(j)], step, &b);
    }
    if (b.seqs.empty()) continue;
    const Status st = m.forward(b, am.data(), logits.data());
    EXPECT_TRUE(st.ok()) << (st.ok() ? std::string() : st.error().to_string());
    if (!st.ok()) return {};
    if (row < 0) continue;
    bool all_decode = true;
    for (const auto& s : b.seqs) all_decode = all_decode && s.n_tokens == 1;
    if (step > 0) ++(all_decode ? *decode_steps : *mixed_steps);
    rows.insert(rows.end(), logits.begin() + size_t(row) * vocab, logits.begin() + size_t(row + 1) * vocab);
  }
  return rows;
}

// Rows of a that differ bytewise from b's; `which` lists them (row 0: the prefill, row i: decode
// step i) with the largest absolute difference in each.
int differing_rows(const std::vector<float>& a, const std::vector<float>& b, int32_t vocab, std::string* which = nullptr) {
  int n = 0;
  for (size_t r = 0; r * size_t(vocab) < a.size(); ++r) {
    if (std::memcmp(a.data() + r * vocab, b.data() + r * vocab, size_t(vocab) * sizeof(float)) == 0) continue;
    ++n;
    if (which != nullptr) {
      double mx = 0.0;
      for (int32_t v = 0; v < vocab; ++v) mx = std::max(mx, std::fabs(double(a[r * vocab + v]) - double(b[r * vocab + v])));
      char buf[64];
      std::snprintf(buf, sizeof(buf), " %zu (%.3g)", r, mx);
      *which += buf;
    }
  }
  return n;
}

class GpuDeterministic : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_P(GpuDeterministic, LogitsDoNotDependOnTheBatch) {
  const std::string name = GetParam();
  const std::string dir = source_dir() + "/tests/data/reference/models/" + name;
  const Target t = target_for(name);
  std::vector<float> det_alone, def_alone;
  for (const bool det : {true, false}) {
    auto model = CudaDecoder::load(dir, options(det));
    ASSERT_TRUE(model.ok()) << model.error().to_string();
    CudaDecoder& m = **model;
    const int32_t vocab = m.config().vocab_size;
    int mixed = 0, decode = 0;
    const auto alone = run_target(m, t, 0, &mixed, &decode);
    ASSERT_EQ(alone.size(), size_t(kDecodeSteps + 1) * vocab);
    // Sanity: the mode computes the model (the oracle's prompt logits, bf16 tolerance).
    const std::vector<float> first(alone.begin(), alone.begin() + vocab);
    EXPECT_LE(max_norm_rel(first, t.last_logits), 2e-2) << name << (det ? " deterministic" : " default");
    (det ? det_alone : def_alone) = alone;
    for (const int32_t n_others : {3, 7, 33}) {
      const auto batched = run_target(m, t, n_others, &mixed, &decode);
      ASSERT_EQ(batched.size(), alone.size());
      std::string which;
      const int diff = differing_rows(batched, alone, vocab, &which);
      std::printf("%s %s, %d others (%d mixed, %d all-decode steps): %d of %d logit rows differ from the lone run%s%s\n",
                  name.c_str(), det ? "deterministic" : "default", n_others, mixed, decode, diff, kDecodeSteps + 1,
                  diff > 0 ? ": rows (max abs diff)" : "", which.c_str());
      EXPECT_GT(mixed, 0);
      EXPECT_GT(decode, 0);
      if (det) {
        EXPECT_EQ(diff, 0) << name << ": deterministic mode, " << n_others << " others";
        // Once more: the same batch again gives the same bits (graphs replayed this time).
        const auto again = run_target(m, t, n_others, &mixed, &decode);
        EXPECT_EQ(differing_rows(again, alone, vocab), 0) << name << ": repeated batch of " << n_others << " others";
      }
    }
  }
  // The two modes compute the same model: close, though not bitwise.
  const int32_t vocab = int32_t(t.last_logits.size());
  for (int32_t r = 0; r <= kDecodeSteps; ++r) {
    const std::vector<float> a(det_alone.begin() + r * vocab, det_alone.begin() + (r + 1) * vocab);
    const std::vector<float> b(def_alone.begin() + r * vocab, def_alone.begin() + (r + 1) * vocab);
    EXPECT_LE(max_norm_rel(a, b), 2e-2) << name << " row " << r << ": deterministic vs default";
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GpuDeterministic, ::testing::Values("llama3-tiny", "qwen3-tiny", "qwen3moe-tiny"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           std::string n = info.param;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace strata::cuda
