// Speculative decoding on the GPU, Llama-3.1-8B shape with random bf16 weights.
//
// `cost`: the step cost model the engine's adaptive k reads, measured. At batch 1, 8 and 64
// (every sequence 512 tokens in), a plain decode step (one token a sequence, the greedy token
// back: what the engine runs without speculation) against a verify step of k + 1 tokens a
// sequence for k = 1..8 (logits at every position, copied to the host: what the engine's
// commit reads), and the decode step of a Llama-3.2-1B-shaped draft. Wall time of the step
// from the host, median of 20 after 3 warm-ups.
//
// `e2e MODEL_DIR`: end-to-end through the Engine (CudaExecutor, dummy weights from MODEL_DIR's
// config). First a plain greedy run records every request's output; then the same requests
// with a benchmark-only proposer that drafts the recorded continuation, each drafted token
// independently replaced by a wrong one with probability 1 - p, either free or running the 1B
// draft's decode forwards for every drafted position (their cost counted, their tokens
// unused). Prints output tok/s, the ratio to the plain run of the same batch, accepted /
// drafted and tokens per verify. 256 output tokens a request (--ignore-eos), prompts of 128.
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench_models.h"
#include "bench_timing.h"
#include "engine/engine.h"
#include "engine/proposer.h"
#include "runtime/cuda/cuda_executor.h"
#include "runtime/cuda/cuda_model.h"

namespace strata::cuda::bench {
namespace {

using Clock = std::chrono::steady_clock;

double since_ms(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// Llama-3.2-1B: 16 layers, 2048 hidden, 8192 FFN, 32/8 heads of 64, vocab 128256, tied head.
ModelConfig llama1b() {
  ModelConfig c = llama8b();
  c.hidden = 2048;
  c.n_layers = 16;
  c.head_dim = 64;
  c.intermediate = 8192;
  c.tie_embeddings = true;
  c.rope.factor = 32.0;
  return c;
}

CudaModelOptions step_options(const ModelConfig& cfg, int32_t batch, int32_t tokens_per_seq, int32_t ctx) {
  CudaModelOptions o;
  o.block_size = 16;
  o.max_tokens = std::max<int32_t>(batch * tokens_per_seq, 256);
  o.max_seqs = batch;
  o.max_logit_rows = batch * tokens_per_seq;
  o.max_blocks_per_seq = (ctx + tokens_per_seq) / 16 + 2;
  o.kv_cache_bytes = (int64_t(batch) * o.max_blocks_per_seq + 16) * 16 * cfg.n_layers * 2 * cfg.n_kv_heads * cfg.head_dim * 2;
  return o;
}

StepBatch spans(int32_t batch, int32_t n, int32_t ctx, int32_t blocks_per_seq, int32_t vocab, bool all) {
  StepBatch b;
  for (int32_t s = 0; s < batch; ++s) {
    SeqSpan sp;
    for (int32_t i = 0; i < blocks_per_seq; ++i) sp.block_table.push_back(s * blocks_per_seq + i);
    sp.pos0 = ctx;
    sp.n_tokens = n;
    sp.logits_all = all;
    sp.logits_last = !all;
    b.seqs.push_back(sp);
    for (int32_t t = 0; t < n; ++t) b.tokens.push_back((s * 7919 + t * 31 + 13) % vocab);
  }
  return b;
}

// Median wall milliseconds of a step: enqueue, then the argmax of every row and the host
// logits of the rows in `rows` (fetch_rows synchronizes).
double step_ms(CudaDecoder& m, const StepBatch& b, bool logits_to_host) {
  const int64_t n_rows = b.n_logit_rows();
  std::vector<int32_t> am(static_cast<size_t>(n_rows));
  std::vector<int32_t> rows;
  if (logits_to_host) {
    for (int64_t r = 0; r < n_rows; ++r) rows.push_back(int32_t(r));
  }
  std::vector<float> logits(rows.size() * size_t(m.config().vocab_size));
  std::vector<double> t;
  for (int i = 0; i < 23; ++i) {
    const auto t0 = Clock::now();
    check_ok(m.enqueue(b));
    check_ok(m.fetch_rows(am.data(), rows.data(), int64_t(rows.size()), logits.data()));
    if (i >= 3) t.push_back(since_ms(t0));
  }
  return median(t);
}

int cost() {
  constexpr int32_t kCtx = 512, kMaxK = 8;
  for (const int32_t batch : {1, 8, 64}) {
    const ModelConfig cfg = llama8b();
    const CudaModelOptions o = step_options(cfg, batch, kMaxK + 1, kCtx);
    auto mr = CudaDecoder::random(cfg, o, 4321, 0.02f);
    if (!mr.ok()) {
      std::fprintf(stderr, "%s\n", mr.error().to_string().c_str());
      return 1;
    }
    CudaDecoder& m = **mr;
    m.set_cuda_graphs(true);
    const int32_t bps = o.max_blocks_per_seq, V = cfg.vocab_size;
    const double plain = step_ms(m, spans(batch, 1, kCtx, bps, V, false), false);
    std::printf("b=%d plain decode step (greedy token back): %.3f ms\n", batch, plain);
    for (int32_t k = 1; k <= kMaxK; ++k) {
      const StepBatch b = spans(batch, k + 1, kCtx, bps, V, true);
      const double dev = step_ms(m, b, false);
      const double host = step_ms(m, b, true);
      std::printf("b=%d verify k=%d (%d tokens): %.3f ms device + argmax, %.3f ms with %lld logit rows to the host "
                  "= %.2fx plain; break-even at %.2f tokens per verify\n",
                  batch, k, batch * (k + 1), dev, host, (long long)b.n_logit_rows(), host / plain, host / plain);
    }
    (*mr).reset();
    const ModelConfig dc = llama1b();
    auto dr = CudaDecoder::random(dc, step_options(dc, batch, 1, kCtx + kMaxK), 99, 0.02f);
    if (!dr.ok()) {
      std::fprintf(stderr, "%s\n", dr.error().to_string().c_str());
      return 1;
    }
    (*dr)->set_cuda_graphs(true);
    const double draft = step_ms(**dr, spans(batch, 1, kCtx, (*dr)->options().max_blocks_per_seq, V, false), false);
    std::printf("b=%d draft (Llama-3.2-1B shape) decode step: %.3f ms = %.3f of the target's plain step\n", batch, draft,
                draft / plain);
  }
  return 0;
}

// Drafts a request's recorded greedy continuation, each token independently wrong with
// probability 1 - p; optionally runs a draft model's decode step per drafted position.
class OracleProposer : public Proposer {
 public:
  OracleProposer(std::map<std::vector<int32_t>, std::vector<int32_t>> outputs, int32_t prompt_len, double p,
                 CudaDecoder* draft)
      : outputs_(std::move(outputs)), prompt_len_(prompt_len), p_(p), draft_(draft), rng_(7) {}
  const char* name() const override { return draft_ ? "oracle+1B" : "oracle"; }
  void propose(std::span<const DraftRow> rows, std::vector<std::vector<int32_t>>* drafts) override {
    drafts->assign(rows.size(), {});
    int32_t k_max = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const DraftRow& r = rows[i];
      const std::vector<int32_t> prompt(r.tokens.begin(), r.tokens.begin() + prompt_len_);
      const auto& out = outputs_.at(prompt);
      // tokens = prompt + generated; the last generated one is pending: its successors are
      // out[g], out[g + 1], ... with g generated tokens so far.
      const size_t g = r.tokens.size() - size_t(prompt_len_);
      for (int32_t j = 0; j < r.max_k && g + size_t(j) < out.size(); ++j) {
        int32_t t = out[g + size_t(j)];
        if (coin_(rng_) >= p_) t = (t + 1 + int32_t(rng_() % 1000)) % 128000;
        (*drafts)[i].push_back(t);
      }
      k_max = std::max(k_max, int32_t((*drafts)[i].size()));
    }
    if (draft_ != nullptr && k_max > 0) {
      // The draft's k_max sequential decode steps over the drafting rows (one token each).
      const int32_t bps = draft_->options().max_blocks_per_seq;
      StepBatch b = spans(int32_t(rows.size()), 1, 256, bps, 128000, false);
      std::vector<int32_t> am(rows.size());
      for (int32_t j = 0; j < k_max; ++j) {
        for (auto& s : b.seqs) s.pos0 = 256 + j;
        check_ok(draft_->forward(b, am.data()));
      }
    }
  }

 private:
  std::map<std::vector<int32_t>, std::vector<int32_t>> outputs_;
  int32_t prompt_len_;
  double p_;
  CudaDecoder* draft_;
  std::mt19937_64 rng_;
  std::uniform_real_distribution<double> coin_{0.0, 1.0};
};

struct E2e {
  double tok_s = 0.0;
  int64_t drafted = 0, accepted = 0, verifies = 0, steps = 0, overlapped = 0;
  std::map<std::vector<int32_t>, std::vector<int32_t>> outputs;
};

constexpr int32_t kPrompt = 128, kOutput = 256;

E2e run_engine(const std::string& dir, int32_t batch, bool deterministic, const SpeculativeOptions& spec) {
  E2e r;
  CudaEngineOptions co;
  co.deterministic = deterministic;
  co.num_draft_tokens = spec.method == "off" ? 0 : spec.num_draft_tokens;
  co.random_weights = true;
  co.seed = 1;
  co.kv_cache_bytes = int64_t(12) << 30;  // leaves room for a draft model beside it
  co.max_num_seqs = std::max(batch, 8);
  co.max_batch_tokens = 2048;
  co.max_model_len = 1024;
  auto parts = make_cuda_engine_parts(dir, co);
  if (!parts.ok()) {
    std::fprintf(stderr, "%s\n", parts.error().to_string().c_str());
    std::exit(1);
  }
  EngineOptions eo;
  eo.block_size = co.block_size;
  eo.max_batch_tokens = co.max_batch_tokens;
  eo.max_num_seqs = co.max_num_seqs;
  eo.max_model_len = co.max_model_len;
  eo.max_queued = 4096;
  eo.kv_codecs = parts->kv_codecs;
  eo.model_identity = "bench";
  eo.prefix_caching = false;
  eo.speculative = spec;
  auto e = Engine::create(std::move(parts->shape), eo, std::move(parts->executor));
  if (!e.ok()) {
    std::fprintf(stderr, "%s\n", e.error().to_string().c_str());
    std::exit(1);
  }
  Engine& engine = **e;
  engine.start();
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < batch; ++i) {
    std::vector<int32_t> p;
    std::mt19937 rng(uint32_t(100 + i));
    for (int32_t t = 0; t < kPrompt; ++t) p.push_back(int32_t(1000 + rng() % 100000));
    prompts.push_back(std::move(p));
  }
  const auto t0 = Clock::now();
  std::vector<std::shared_ptr<RequestStream>> streams;
  for (int32_t i = 0; i < batch; ++i) {
    GenerationRequest q;
    q.id = "r" + std::to_string(i);
    q.prompt = prompts[size_t(i)];
    q.max_tokens = kOutput;
    q.ignore_eos = true;
    q.sampling.temperature = 0.0f;
    auto s = engine.submit(q);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.error().to_string().c_str());
      std::exit(1);
    }
    streams.push_back(*s);
  }
  int64_t n_out = 0;
  for (int32_t i = 0; i < batch; ++i) {
    std::vector<int32_t> toks;
    for (;;) {
      auto ev = streams[size_t(i)]->next(std::chrono::seconds(600));
      if (!ev) {
        std::fprintf(stderr, "request timed out\n");
        std::exit(1);
      }
      toks.insert(toks.end(), ev->tokens.begin(), ev->tokens.end());
      if (ev->final) break;
    }
    n_out += int64_t(toks.size());
    r.outputs[prompts[size_t(i)]] = std::move(toks);
  }
  r.tok_s = double(n_out) / (since_ms(t0) * 1e-3);
  const EngineStats st = engine.stats();
  r.drafted = st.spec_draft_tokens;
  r.accepted = st.spec_accepted_tokens;
  r.verifies = st.spec_verifies;
  r.steps = st.steps;
  r.overlapped = st.overlapped_steps;
  engine.shutdown();
  return r;
}

// only: run the configurations whose label ("deterministic b=64 p=0.5") contains it.
int e2e(const std::string& dir, const std::string& only) {
  std::unique_ptr<CudaDecoder> draft;
  {
    const ModelConfig dc = llama1b();
    auto dr = CudaDecoder::random(dc, step_options(dc, 64, 1, 256 + 16), 99, 0.02f);
    if (!dr.ok()) {
      std::fprintf(stderr, "%s\n", dr.error().to_string().c_str());
      return 1;
    }
    draft = std::move(*dr);
    draft->set_cuda_graphs(true);
  }
  struct Config {
    bool deterministic;
    int32_t batch;
    double p;
    int32_t k;
    bool adaptive;
  };
  // Under --deterministic a verify computes the bits of plain decoding, so the recorded
  // continuation is the target's greedy one at every position and p is the acceptance of each
  // drafted token. By default a verify rounds as a prefill chunk: on random weights, whose
  // logits are nearly flat, that moves the argmax often and acceptance falls far below p.
  const std::vector<Config> configs = {{true, 1, 0.7, 4, false},  {true, 1, 0.9, 6, false}, {true, 1, 0.7, 4, true},
                                       {true, 1, 0.9, 6, true},   {true, 64, 0.5, 4, true}, {true, 64, 0.9, 4, true},
                                       {false, 1, 0.9, 6, false}, {false, 64, 0.5, 4, true}};
  std::map<std::pair<bool, int32_t>, E2e> plain;
  for (const Config& c : configs) {
    const std::pair<bool, int32_t> key{c.deterministic, c.batch};
    const char* mode = c.deterministic ? "deterministic" : "default";
    char label[96];
    std::snprintf(label, sizeof label, "%s b=%d p=%.1f", mode, c.batch, c.p);
    if (std::string(label).find(only) == std::string::npos) continue;
    if (!plain.count(key)) {
      plain[key] = run_engine(dir, c.batch, c.deterministic, SpeculativeOptions{});
      std::printf("%s b=%d plain: %.1f output tok/s\n", mode, c.batch, plain[key].tok_s);
    }
    for (const bool with_draft : {true, false}) {
      SpeculativeOptions s;
      s.method = "external";
      s.num_draft_tokens = c.k;
      s.adaptive = c.adaptive;
      s.proposer = std::make_shared<OracleProposer>(plain[key].outputs, kPrompt, c.p, with_draft ? draft.get() : nullptr);
      const E2e r = run_engine(dir, c.batch, c.deterministic, s);
      std::printf("%s b=%d p=%.1f k=%d%s, %s proposer: %.1f output tok/s = %.3fx plain; accepted/drafted %lld/%lld = %.3f; "
                  "%.2f tokens per verify; %lld of %lld steps overlapped\n",
                  mode, c.batch, c.p, c.k, c.adaptive ? " adaptive" : " fixed", with_draft ? "1B-draft-cost" : "free", r.tok_s,
                  r.tok_s / plain[key].tok_s, (long long)r.accepted, (long long)r.drafted,
                  r.drafted ? double(r.accepted) / double(r.drafted) : 0.0,
                  r.verifies ? double(r.accepted + r.verifies) / double(r.verifies) : 0.0, (long long)r.overlapped,
                  (long long)r.steps);
    }
  }
  return 0;
}

}  // namespace
}  // namespace strata::cuda::bench

int main(int argc, char** argv) {
  using namespace strata::cuda::bench;
  const std::string mode = argc > 1 ? argv[1] : "cost";
  if (mode == "cost") return cost();
  if (mode == "e2e" && argc > 2) return e2e(argv[2], argc > 3 ? argv[3] : "");
  std::fprintf(stderr, "usage: bench_cuda_spec cost | e2e MODEL_DIR [CONFIG-SUBSTRING]\n");
  return 2;
}
