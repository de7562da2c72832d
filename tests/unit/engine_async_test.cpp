// Overlapped ("async") scheduling in the engine (engine_async.cpp) on the host: an executor
// that queues steps like a device (enqueue / collect, at most two in flight) and takes each
// fed decode's input from the previous step's argmax, over a model whose logits hash every
// cached (token, position) pair, so a wrong fed token, placeholder, block or position changes
// every later token. Many greedy requests in a small pool (preemptions), shared prefixes
// (prefix hits), varied max_tokens, stop ids and EOS that end requests with a step in flight, a
// cancellation, and host-bound requests (logprobs) that make the engine fall back to single
// steps: the tokens equal those of single steps, request by request. An executor that computes
// logprobs with the token (device_logprobs()) takes requests with logprobs off the host: they
// overlap, with the host path's logprobs. Constrained requests (a regex grammar) on an
// executor that takes grammar masks overlap too: their steps are queued with masks_later and
// sampled once the previous step's tokens have advanced the matchers; the tokens equal the
// host sampler's under the host's masks (with token fill, one step at a time). Prompt logprobs
// make only their prompt's steps run alone. Host and disk KV tiers and checkpoints keep steps
// overlapped (tokens equal single steps), and a stopped run resumes from its checkpoints with
// the uninterrupted tokens, sampled rows included.
#include <gtest/gtest.h>

#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <thread>

#include "../support/engine_test_support.h"
#include "core/check.h"
#include "engine/engine.h"
#include "runtime/host/model_runner.h"
#include "sampling/grammar/grammar.h"
#include "sampling/grammar/matcher.h"
#include "sampling/logprobs.h"

namespace strata {
namespace {

constexpr int32_t kVocab = 64;

uint64_t mix(uint64_t x) { return test::mix(x); }

// One layer, one KV head of width 2 holding (token, position); the logits of position p hash
// the pairs read back through the block table for [0, p].
class HashModel final : public Model {
 public:
  explicit HashModel(ThreadPool& pool) : Model(config(), pool) {}
  static ModelConfig config() {
    ModelConfig c;
    c.model_type = "hash";
    c.vocab_size = kVocab;
    c.n_layers = 1;
    c.max_position = 4096;
    c.eos_ids = {2};
    return c;
  }
  std::vector<KvLayerSpec> kv_layout() const override {
    KvLayerSpec s;
    s.n_kv_heads = 1;
    s.head_dim_k = 2;
    s.head_dim_v = 2;
    return {s};
  }
  void forward(const StepBatch& batch, KvStorage& kv, StateStorage*, float* logits) override {
    const int32_t bs = kv.block_size();
    float* k = kv.k_pool(0);
    auto slot = [&](const SeqSpan& s, int32_t p) {
      return k + (size_t(s.block_table.at(size_t(p / bs))) * size_t(bs) + size_t(p % bs)) * 2;
    };
    size_t t = 0;
    for (const auto& s : batch.seqs) {
      for (int32_t i = 0; i < s.n_tokens; ++i) {
        float* w = slot(s, s.pos0 + i);
        w[0] = float(batch.tokens[t + size_t(i)]);
        w[1] = float(s.pos0 + i);
      }
      for (int32_t i = 0; i < s.n_tokens; ++i) {
        if (!(s.logits_all || (s.logits_last && i == s.n_tokens - 1))) continue;
        uint64_t h = 0;
        for (int32_t q = 0; q <= s.pos0 + i; ++q) {
          const float* r = slot(s, q);
          h = mix(h ^ (uint64_t(int64_t(r[0])) * 131 + uint64_t(int64_t(r[1]))));
        }
        for (int32_t v = 0; v < kVocab; ++v) logits[v] = float(mix(h ^ uint64_t(v)) % 1000) / 100.0f;
        logits += kVocab;
      }
      t += size_t(s.n_tokens);
    }
    // A step takes a moment, so the cancelled request is still generating when it is cancelled.
    std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
};

// A host ModelRunner behind the overlapped interface: enqueue() runs the step at once (with the
// fed inputs taken from the previous step's argmax) and queues its argmax; collect() hands the
// oldest. The placeholders in the sequences are put back after the step, as a device leaves them.
// With device_logprobs, it also takes greedy RowSamples and answers them like a device sampler:
// the argmax and, when asked, the row's logprobs (compute_logprobs), with no host logits.
class QueuedHostExecutor final : public StepExecutor {
 public:
  QueuedHostExecutor(Model& model, const std::vector<KvLayerSpec>& layout, int32_t n_blocks, int32_t block_size,
                     bool device_logprobs)
      : inner_(model, layout, n_blocks, block_size), device_logprobs_(device_logprobs) {}

  const StepRows& run(const StepPlan& plan, const std::vector<uint8_t>& want, std::span<const RowSample> samples) override {
    EXPECT_TRUE(queue_.empty()) << "run() with steps queued";
    if (!device_logprobs_) {
      const StepRows& r = inner_.run(plan, want, samples);
      rows_ = r;
      rows_.argmax = argmax(r.logits, r.host_row.size());
    } else {
      const float* logits = inner_.run(plan);
      rows_ = StepRows{};
      rows_.logits = logits;  // row r at r: the host rows are those of want
      rows_.argmax = argmax(logits, want.size());
      rows_.host_row.assign(want.size(), -1);
      for (size_t r = 0; r < want.size(); ++r) rows_.host_row[r] = want[r] != 0 ? int32_t(r) : -1;
      answer_samples(logits, samples, rows_);
    }
    last_.clear();  // a later feed may not name this step's rows
    ++plain_steps;
    return rows_;
  }
  bool device_sampling() const override { return device_logprobs_; }
  bool device_logprobs() const override { return device_logprobs_; }
  bool device_masks() const override { return device_logprobs_; }
  bool supports_overlap() const override { return true; }
  void enqueue(const StepPlan& plan, const std::vector<uint8_t>& want, std::span<const RowSample> samples,
               std::span<const TokenFeed> feed, bool masks_later) override {
    STRATA_CHECK(queue_.size() < 2, "two steps queued");
    STRATA_CHECK(!deferred_, "a step waits for its masks");
    for (uint8_t w : want) STRATA_CHECK(w == 0, "an overlapped step has no host rows");
    std::vector<std::pair<Sequence*, int32_t>> placeholders;
    for (const TokenFeed& f : feed) {
      const ScheduledSpan& span = plan.spans.at(size_t(f.span));
      STRATA_CHECK(span.n_tokens == 1, "a fed span is one decode");
      Sequence* s = span.seq;
      placeholders.emplace_back(s, s->tokens.at(size_t(span.pos0)));
      s->tokens[size_t(span.pos0)] = last_.at(size_t(f.prev_row));
    }
    const float* logits = inner_.run(plan);
    for (auto& [s, t] : placeholders) s->tokens[size_t(s->n_computed)] = t;
    size_t n_rows = 0;
    for (const auto& span : plan.spans) n_rows += span.sample ? 1 : 0;
    last_ = argmax(logits, n_rows);
    StepRows q;
    q.argmax = last_;
    q.host_row.assign(n_rows, -1);
    if (masks_later) {
      // Sampled in sample_enqueued(), from this step's logits and the samplers' state now.
      deferred_ = true;
      deferred_logits_.assign(logits, logits + n_rows * size_t(kVocab));
      deferred_samplers_.clear();
      deferred_draws_.clear();
      for (const RowSample& r : samples) {
        STRATA_CHECK(r.mask_later || r.mask.words == nullptr, "a deferred step's masks come later");
        deferred_samplers_.push_back(r.sampler ? std::optional<Sampler>(*r.sampler) : std::nullopt);
        deferred_draws_.push_back(r.draw);
      }
      queue_.push_back(std::move(q));
      return;
    }
    if (device_logprobs_) {
      answer_samples(logits, samples, q);
      // The next step's fed inputs are the tokens drawn, as a device's merged tokens.
      for (size_t r = 0; r < q.sampled.size(); ++r) {
        if (q.sampled[r] != StepRows::kNotSampled) last_[r] = q.sampled[r];
      }
    }
    queue_.push_back(std::move(q));
  }
  void sample_enqueued(std::span<const TokenMask> masks) override {
    STRATA_CHECK(deferred_, "no step waits for its masks");
    deferred_ = false;
    ++deferred_steps;
    StepRows& q = queue_.back();
    std::vector<RowSample> samples(deferred_samplers_.size());
    for (size_t r = 0; r < samples.size(); ++r) {
      if (deferred_samplers_[r]) samples[r].sampler = &*deferred_samplers_[r];
      samples[r].draw = deferred_draws_[r];
      if (r < masks.size()) samples[r].mask = masks[r];
    }
    answer_samples(deferred_logits_.data(), samples, q);
    // The next step's fed inputs are the tokens drawn, as a device's merged tokens.
    for (size_t r = 0; r < q.sampled.size(); ++r) {
      if (q.sampled[r] != StepRows::kNotSampled) last_[r] = q.sampled[r];
    }
  }
  const StepRows& collect() override {
    STRATA_CHECK(!queue_.empty(), "nothing queued");
    STRATA_CHECK(!deferred_ || queue_.size() > 1, "collect() of a step that waits for its masks");
    rows_ = std::move(queue_.front());
    queue_.pop_front();
    return rows_;
  }
  int32_t vocab() const override { return inner_.vocab(); }
  int32_t n_kv_blocks() const override { return inner_.n_kv_blocks(); }
  bool device_argmax() const override { return true; }
  int64_t state_floats() const override { return 0; }
  void save_state(int32_t, float*) override {}
  void load_state(int32_t, const float*) override {}
  std::vector<int64_t> block_tensor_bytes() const override { return inner_.block_tensor_bytes(); }
  void read_block(int32_t b, uint8_t* out) override { inner_.read_block(b, out); }
  void write_block(int32_t b, const uint8_t* in) override { inner_.write_block(b, in); }
  int64_t plain_steps = 0;
  int64_t logprob_rows = 0;  // rows answered with their logprobs
  int64_t masked_rows = 0;   // rows sampled under a grammar mask
  int64_t deferred_steps = 0;  // enqueued with masks_later

 private:
  void answer_samples(const float* logits, std::span<const RowSample> samples, StepRows& out) {
    const size_t n = out.argmax.size();
    out.sampled.assign(n, StepRows::kNotSampled);
    out.top_n.assign(n, -1);
    out.chosen_logprob.assign(n, 0.0f);
    out.top_ids.assign(n * size_t(kMaxTopLogprobs), -1);
    out.top_logprobs.assign(n * size_t(kMaxTopLogprobs), 0.0f);
    for (size_t r = 0; r < samples.size() && r < n; ++r) {
      if (samples[r].sampler == nullptr) continue;
      out.sampled[r] = out.argmax[r];
      if (!samples[r].sampler->params().greedy()) {
        // A device's sampled token is a function of the row and the engine's draw: here a
        // cheap one, so a draw out of order changes the token.
        out.sampled[r] = int32_t((uint64_t(out.argmax[r]) + samples[r].draw % 7) % uint64_t(kVocab));
        continue;
      }
      if (!samples[r].sampler->params().logit_bias.empty() || samples[r].mask.words != nullptr) {
        // The host sampler's token (greedy: no draw) under the row's bias and mask; -1 when the
        // mask allows no id, as a device answers.
        const float* row = logits + r * size_t(kVocab);
        const TokenMask& m = samples[r].mask;
        bool any = m.words == nullptr;
        for (int32_t v = 0; v < std::min(kVocab, m.n_ids) && !any; ++v) any = (m.words[v >> 5] >> (v & 31)) & 1u;
        Sampler s = *samples[r].sampler;
        out.sampled[r] = any ? s.sample(row, kVocab, m.words != nullptr ? &m : nullptr) : -1;
        if (m.words != nullptr) ++masked_rows;
      }
      if (samples[r].top_logprobs < 0) continue;
      TokenLogprobs lp;
      STRATA_CHECK(compute_logprobs(logits + r * size_t(kVocab), kVocab, out.argmax[r], samples[r].top_logprobs, &lp).ok(),
                   "logprobs of a row");
      out.top_n[r] = int32_t(lp.top.size());
      out.chosen_logprob[r] = lp.chosen.logprob;
      for (size_t j = 0; j < lp.top.size(); ++j) {
        out.top_ids[r * size_t(kMaxTopLogprobs) + j] = lp.top[j].token;
        out.top_logprobs[r * size_t(kMaxTopLogprobs) + j] = lp.top[j].logprob;
      }
      ++logprob_rows;
    }
  }
  std::vector<int32_t> argmax(const float* logits, size_t n_rows) const {
    std::vector<int32_t> out(n_rows);
    for (size_t r = 0; r < n_rows; ++r) {
      const float* row = logits + r * size_t(kVocab);
      out[r] = int32_t(std::max_element(row, row + kVocab) - row);  // lowest id on ties
    }
    return out;
  }
  ModelRunner inner_;
  StepRows rows_;
  bool device_logprobs_ = false;
  std::vector<int32_t> last_;  // the last enqueued step's argmax
  std::deque<StepRows> queue_;
  bool deferred_ = false;  // the newest queued step waits for sample_enqueued()
  std::vector<float> deferred_logits_;
  std::vector<std::optional<Sampler>> deferred_samplers_;
  std::vector<uint64_t> deferred_draws_;
};

struct Result {
  std::map<std::string, test::Outcome> out;
  EngineStats stats;
  int64_t logprob_rows = 0;  // answered by the executor
  int64_t masked_rows = 0;
  int64_t deferred_steps = 0;
};

// Every request queued before the first step; `cancel_id` is read first and cancelled after
// three tokens.
Result run_workload(ThreadPool& pool, bool overlap, const std::vector<GenerationRequest>& reqs,
                    const std::string& cancel_id = "", bool device_logprobs = false, bool token_fill = true,
                    const std::function<void(EngineOptions&)>& tweak = nullptr) {
  auto model = std::make_unique<HashModel>(pool);
  EngineOptions o;
  o.token_fill = token_fill;
  o.block_size = 4;
  o.kv_blocks = 48;  // 192 tokens for up to 8 sequences of up to 72: preemptions
  o.max_num_seqs = 8;
  o.max_batch_tokens = 24;
  o.async_scheduling = overlap;
  o.model_identity = "hash";
  if (tweak) tweak(o);
  auto layout = resolve_kv_layout(*model, KvCodecConfig{});
  EXPECT_TRUE(layout.ok());
  auto exec = std::make_unique<QueuedHostExecutor>(*model, *layout, o.kv_blocks, o.block_size, device_logprobs);
  const QueuedHostExecutor* executor = exec.get();
  auto e = Engine::create(std::move(model), o, std::move(exec));
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
  Result r;
  if (!e.ok()) return r;
  Engine& engine = **e;
  std::map<std::string, std::shared_ptr<RequestStream>> streams;
  for (const auto& q : reqs) {
    auto s = engine.submit(q);
    EXPECT_TRUE(s.ok()) << q.id << ": " << (s.ok() ? "" : s.error().to_string());
    if (s.ok()) streams[q.id] = *s;
  }
  engine.start();
  if (!cancel_id.empty()) {
    RequestStream& s = *streams.at(cancel_id);
    test::Outcome& o = r.out[cancel_id];
    for (;;) {
      auto ev = s.next(std::chrono::seconds(60));
      if (!ev) break;
      o.tokens.insert(o.tokens.end(), ev->tokens.begin(), ev->tokens.end());
      if (ev->final) {
        o.final = *ev;
        break;
      }
      if (o.tokens.size() >= 3) engine.cancel(cancel_id);
    }
  }
  for (auto& [id, s] : streams) {
    if (id != cancel_id) r.out[id] = test::drain(*s, std::chrono::seconds(60));
  }
  for (int i = 0; i < 200; ++i) {
    r.stats = engine.stats();
    if (r.stats.running == 0 && r.stats.waiting == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  engine.shutdown();
  r.logprob_rows = executor->logprob_rows;
  r.masked_rows = executor->masked_rows;
  r.deferred_steps = executor->deferred_steps;
  return r;
}

std::vector<GenerationRequest> workload() {
  std::vector<GenerationRequest> reqs;
  const std::vector<int32_t> prefix = test::random_ids(99, 12, kVocab);
  for (int i = 0; i < 40; ++i) {
    GenerationRequest r;
    r.id = "r" + std::to_string(i);
    if (i % 3 != 2) r.prompt = prefix;
    const auto tail = test::random_ids(uint64_t(i) + 1, 1 + (i * 7) % 23, kVocab);
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    r.max_tokens = 1 + (i * 11) % 36;
    r.ignore_eos = i % 4 != 0;  // EOS (id 2) may end every fourth
    r.sampling.temperature = 0.0f;
    reqs.push_back(std::move(r));
  }
  return reqs;
}

TEST(EngineAsync, OverlappedStepsGiveTheTokensOfSingleSteps) {
  ThreadPool pool(2);
  std::vector<GenerationRequest> reqs = workload();
  // Stop ids the requests really meet: for every fifth, the token it generates halfway.
  const Result pilot = run_workload(pool, false, reqs);
  for (size_t i = 0; i < reqs.size(); i += 5) {
    const auto& t = pilot.out.at(reqs[i].id).tokens;
    if (t.size() >= 4) reqs[i].stop_ids = {t[t.size() / 2]};
  }
  // Host-bound (logprobs) in the middle of the queue: single steps while it lives.
  GenerationRequest lp = reqs[17];
  lp.id = "logprobs";
  lp.logprobs = 1;
  lp.max_tokens = 5;
  reqs.insert(reqs.begin() + 17, lp);
  reqs[4].max_tokens = 36;  // the cancelled one runs long
  reqs[4].stop_ids.clear();
  reqs[4].ignore_eos = true;

  const Result off = run_workload(pool, false, reqs, "r4");
  const Result on = run_workload(pool, true, reqs, "r4");
  ASSERT_EQ(on.out.size(), reqs.size());
  for (const auto& [id, a] : off.out) {
    const test::Outcome& b = on.out.at(id);
    if (id == "r4") {
      const size_t n = std::min(a.tokens.size(), b.tokens.size());
      EXPECT_GE(n, 3u);
      EXPECT_TRUE(std::equal(a.tokens.begin(), a.tokens.begin() + long(n), b.tokens.begin())) << id;
      EXPECT_EQ(b.final.finish_reason, FinishReason::kCancelled);
      EXPECT_EQ(a.final.finish_reason, FinishReason::kCancelled);
      continue;
    }
    EXPECT_EQ(b.tokens, a.tokens) << id;
    EXPECT_EQ(b.final.finish_reason, a.final.finish_reason) << id << ": " << b.final.message;
    EXPECT_EQ(b.final.stop_token, a.final.stop_token) << id;
    EXPECT_EQ(b.final.usage.completion_tokens, a.final.usage.completion_tokens) << id;
    EXPECT_EQ(b.logprobs.size(), a.logprobs.size()) << id;
  }
  EXPECT_EQ(on.out.at("logprobs").logprobs.size(), 5u);
  EXPECT_EQ(off.stats.overlapped_steps, 0);
  EXPECT_GT(on.stats.overlapped_steps, 0);
  EXPECT_LT(on.stats.overlapped_steps, on.stats.steps) << "the logprobs request ran in single steps";
  EXPECT_GT(on.stats.preemptions, 0) << "the small pool preempts";
  EXPECT_GT(on.stats.prefix_hit_tokens, 0);
  EXPECT_GT(on.stats.finished[int(FinishReason::kStop)], 0);
}

// Only max_tokens ends requests: overlapped scheduling plans the very same steps.
TEST(EngineAsync, LengthOnlyWorkloadPlansTheSameSteps) {
  ThreadPool pool(2);
  std::vector<GenerationRequest> reqs = workload();
  for (auto& r : reqs) r.ignore_eos = true;
  const Result off = run_workload(pool, false, reqs);
  const Result on = run_workload(pool, true, reqs);
  for (const auto& [id, a] : off.out) {
    EXPECT_EQ(on.out.at(id).tokens, a.tokens) << id;
    EXPECT_EQ(on.out.at(id).final.finish_reason, FinishReason::kLength) << id;
  }
  EXPECT_EQ(on.stats.steps, off.stats.steps);
  EXPECT_EQ(on.stats.preemptions, off.stats.preemptions);
  EXPECT_GT(on.stats.preemptions, 0);
  EXPECT_GT(on.stats.overlapped_steps, on.stats.steps / 2);
}

// Every request asks for logprobs (top_logprobs 0, 3, 20). On an executor that computes them
// with the token they are not host-bound: overlapped steps plan the same steps as single ones
// (max_tokens alone ends requests) and give the host path's tokens and logprobs (the same
// compute_logprobs over the same logits), one step at a time (run()) and overlapped (collect()).
TEST(EngineAsync, DeviceLogprobsOverlapWithTheHostPathsValues) {
  ThreadPool pool(2);
  std::vector<GenerationRequest> reqs = workload();
  const int32_t top_ns[3] = {0, 3, 20};
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].ignore_eos = true;
    reqs[i].logprobs = top_ns[i % 3];
  }
  const Result host = run_workload(pool, true, reqs, "", false);
  const Result single = run_workload(pool, false, reqs, "", true);
  const Result overlap = run_workload(pool, true, reqs, "", true);
  EXPECT_EQ(host.stats.overlapped_steps, 0) << "logprobs from host logits are host-bound";
  EXPECT_EQ(host.logprob_rows, 0);
  EXPECT_EQ(single.stats.overlapped_steps, 0);
  EXPECT_GT(single.logprob_rows, 0);
  EXPECT_GT(overlap.stats.overlapped_steps, overlap.stats.steps / 2);
  EXPECT_GT(overlap.logprob_rows, 0);
  EXPECT_EQ(overlap.stats.steps, host.stats.steps) << "the same plans";
  EXPECT_EQ(single.stats.steps, host.stats.steps) << "the same plans";
  for (const auto& q : reqs) {
    const test::Outcome& h = host.out.at(q.id);
    ASSERT_EQ(h.tokens.size(), size_t(q.max_tokens)) << q.id << ": " << h.final.message;
    ASSERT_EQ(h.logprobs.size(), h.tokens.size()) << q.id;
    for (const Result* d : {&single, &overlap}) {
      const test::Outcome& o = d->out.at(q.id);
      const std::string what = q.id + (d == &single ? " (single steps)" : " (overlapped)");
      EXPECT_EQ(o.tokens, h.tokens) << what;
      EXPECT_EQ(o.final.finish_reason, FinishReason::kLength) << what << ": " << o.final.message;
      ASSERT_EQ(o.logprobs.size(), h.logprobs.size()) << what;
      for (size_t t = 0; t < h.logprobs.size(); ++t) {
        const TokenLogprobs& a = h.logprobs[t];
        const TokenLogprobs& b = o.logprobs[t];
        EXPECT_EQ(b.chosen.token, a.chosen.token) << what << " token " << t;
        EXPECT_EQ(b.chosen.logprob, a.chosen.logprob) << what << " token " << t;
        ASSERT_EQ(b.top.size(), size_t(q.logprobs)) << what << " token " << t;
        ASSERT_EQ(a.top.size(), b.top.size()) << what << " token " << t;
        for (size_t j = 0; j < a.top.size(); ++j) {
          EXPECT_EQ(b.top[j].token, a.top[j].token) << what << " token " << t << " top " << j;
          EXPECT_EQ(b.top[j].logprob, a.top[j].logprob) << what << " token " << t << " top " << j;
        }
      }
    }
  }
}

// A 64-id vocabulary over the hash model: id 2 is EOS (a stop id), the others one or two
// characters, so a grammar sometimes forces a token ("a" must be followed by "b").
std::shared_ptr<const grammar::Vocabulary> hash_vocab() {
  static const std::shared_ptr<const grammar::Vocabulary> v = [] {
    const std::string chars = "abcdefghij0123456789,;";
    std::vector<std::string> bytes;
    for (int32_t id = 0; id < kVocab; ++id) {
      if (id == 2) {
        bytes.push_back("</s>");
      } else if (id < int32_t(chars.size())) {
        bytes.push_back(std::string(1, chars[size_t(id)]));
      } else {
        bytes.push_back(std::string(1, chars[size_t(id) % 10]) + chars[size_t(id * 7) % chars.size()]);
      }
    }
    auto made = grammar::Vocabulary::create(std::move(bytes), {2}, {2});
    STRATA_CHECK(made.ok(), "the test vocabulary");
    return *made;
  }();
  return v;
}

// Greedy requests under one regex, half of them with unconstrained neighbours: host logits and
// the host sampler's masks (with token fill), the executor's masks one step at a time, and
// overlapped steps whose sampling waits for the masks give the same tokens; every constrained
// output is one the grammar accepts, and those that end by the grammar are complete.
TEST(EngineAsync, ConstrainedRowsOverlapWithMasksAfterTheForward) {
  ThreadPool pool(2);
  grammar::GrammarCache cache;
  const grammar::GrammarSpec spec{grammar::GrammarKind::kRegex, "(ab|c[0-9]+|d[e-j]*)(,(ab|c[0-9]+|d[e-j]*))*;", {}};
  auto masks = cache.get_masks(spec, hash_vocab());
  ASSERT_TRUE(masks.ok()) << masks.error().to_string();
  std::vector<GenerationRequest> reqs = workload();
  int n_constrained = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (i % 2 == 1 && i % 7 != 3) continue;  // unconstrained neighbours
    reqs[i].grammar = *masks;
    reqs[i].grammar_key = grammar::GrammarCache::key_of(spec);
    reqs[i].ignore_eos = false;
    reqs[i].max_tokens = 8 + int32_t(i % 5) * 9;
    ++n_constrained;
    // Reasoning first: opened by the prompt, or by the first token (id 40, pushed there by a
    // bias); a bias makes the end marker (id 41) come soon.
    if (i % 4 == 0) reqs[i].grammar_in_think = true;
    if (i % 4 == 0 || i % 4 == 1) {
      reqs[i].grammar_think_end = 41;
      reqs[i].sampling.logit_bias = {{41, 2.5f}};
      reqs[i].max_tokens += 20;
    }
    if (i % 4 == 1) {
      reqs[i].grammar_think_open = 40;
      reqs[i].sampling.logit_bias.push_back({40, 30.0f});
    }
  }
  const Result host = run_workload(pool, false, reqs, "", false, true);
  const Result single = run_workload(pool, false, reqs, "", true, false);
  const Result overlap = run_workload(pool, true, reqs, "", true, true);
  EXPECT_EQ(host.masked_rows, 0);
  EXPECT_GT(single.masked_rows, 0);
  EXPECT_EQ(single.deferred_steps, 0);
  EXPECT_GT(overlap.deferred_steps, 0);
  EXPECT_GT(overlap.stats.overlapped_steps, overlap.stats.steps / 2) << "constrained rows are not host-bound";
  int64_t filled = 0, ended_by_grammar = 0, reasoned = 0, free_reasoning = 0;
  for (const auto& q : reqs) {
    const test::Outcome& h = host.out.at(q.id);
    filled += h.final.usage.fill_tokens;
    for (const Result* d : {&single, &overlap}) {
      const test::Outcome& o = d->out.at(q.id);
      const std::string what = q.id + (d == &single ? " (single steps)" : " (overlapped)");
      EXPECT_EQ(o.tokens, h.tokens) << what;
      EXPECT_EQ(o.final.finish_reason, h.final.finish_reason) << what << ": " << o.final.message;
    }
    EXPECT_EQ(overlap.out.at(q.id).final.usage.fill_tokens, 0) << q.id << ": overlapped steps do not fill";
    if (q.grammar == nullptr) continue;
    // The grammar's part: after the reasoning section when there is one.
    size_t from = 0;
    if (q.grammar_think_end >= 0) {
      const bool opened = q.grammar_in_think || (!h.tokens.empty() && h.tokens[0] == q.grammar_think_open);
      if (!q.grammar_in_think) {
        EXPECT_TRUE(opened) << q.id << ": the first token opens the reasoning (bias)";
      }
      if (opened) {
        auto end = std::find(h.tokens.begin() + (q.grammar_in_think ? 0 : 1), h.tokens.end(), q.grammar_think_end);
        if (end == h.tokens.end()) {
          EXPECT_EQ(h.final.finish_reason, FinishReason::kLength) << q.id << ": still reasoning";
          continue;
        }
        from = size_t(end - h.tokens.begin()) + 1;
        ++reasoned;
        // Free text: somewhere before the end marker a token the grammar would refuse there.
        grammar::Matcher g(*masks, 0);
        bool refused = false;
        for (size_t j = q.grammar_in_think ? 0 : 1; j + 1 < from && !refused; ++j) refused = !g.accept_token(h.tokens[j]);
        free_reasoning += refused ? 1 : 0;
      }
    }
    grammar::Matcher m(*masks, 0);
    for (size_t j = from; j < h.tokens.size(); ++j) {
      ASSERT_TRUE(m.accept_token(h.tokens[j])) << q.id << ": token " << h.tokens[j] << " (" << j << ") outside the grammar";
    }
    if (h.final.finish_reason == FinishReason::kStop) {
      EXPECT_TRUE(m.is_complete()) << q.id;
      ++ended_by_grammar;
    } else {
      EXPECT_EQ(h.final.finish_reason, FinishReason::kLength) << q.id << ": " << h.final.message;
    }
  }
  std::printf("%d constrained requests: %lld ended by the grammar, %lld tokens filled on the host path; %lld rows "
              "masked by the executor, %lld steps sampled after their masks\n",
              n_constrained, (long long)ended_by_grammar, (long long)filled, (long long)overlap.masked_rows,
              (long long)overlap.deferred_steps);
  EXPECT_GT(ended_by_grammar, 0);
  EXPECT_GT(filled, 0) << "the grammar forces tokens (b after a)";
  std::printf("%lld requests reasoned first and then followed the grammar; %lld of those reasoned with tokens the "
              "grammar refuses\n", (long long)reasoned, (long long)free_reasoning);
  EXPECT_GE(reasoned, 6);
  EXPECT_GT(free_reasoning, 0) << "the reasoning section is not constrained";
}

// Prompt logprobs no longer make a request host-bound: only the steps that compute its prompt
// (every position's logits on the host) run alone; its decodes overlap. Tokens and prompt
// logprobs equal those of single steps.
TEST(EngineAsync, PromptLogprobsRunAloneOnlyWhileThePromptIsComputed) {
  ThreadPool pool(2);
  std::vector<GenerationRequest> reqs = workload();
  for (size_t i = 0; i < reqs.size(); ++i) {
    reqs[i].ignore_eos = true;
    reqs[i].prompt_logprobs = i % 5 == 1;
  }
  const Result single = run_workload(pool, false, reqs, "", true);
  const Result overlap = run_workload(pool, true, reqs, "", true);
  EXPECT_EQ(single.stats.overlapped_steps, 0);
  EXPECT_GT(overlap.stats.overlapped_steps, overlap.stats.steps / 2);
  EXPECT_LT(overlap.stats.overlapped_steps, overlap.stats.steps) << "the prompt steps ran alone";
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerationRequest& q = reqs[i];
    const test::Outcome& a = single.out.at(q.id);
    const test::Outcome& b = overlap.out.at(q.id);
    EXPECT_EQ(b.tokens, a.tokens) << q.id;
    EXPECT_EQ(b.final.finish_reason, FinishReason::kLength) << q.id << ": " << b.final.message;
    ASSERT_EQ(b.prompt_logprobs.size(), a.prompt_logprobs.size()) << q.id;
    EXPECT_EQ(a.prompt_logprobs.size(), q.prompt_logprobs ? q.prompt.size() - 1 : 0u) << q.id;
    for (size_t t = 0; t < a.prompt_logprobs.size(); ++t) {
      EXPECT_EQ(b.prompt_logprobs[t].chosen.token, a.prompt_logprobs[t].chosen.token) << q.id << " " << t;
      EXPECT_EQ(b.prompt_logprobs[t].chosen.logprob, a.prompt_logprobs[t].chosen.logprob) << q.id << " " << t;
    }
  }
}

// Host and disk KV tiers and checkpoints every 4 tokens with overlapped steps, in a pool small
// enough that blocks are demoted and promoted while steps are in flight, greedy and seeded
// sampled rows (drawn on the "device" from the engine's draws): the tokens equal single steps
// without tiers. Then a run stopped mid-generation, and a new engine over the same directories
// resumes from the checkpoints with the uninterrupted tokens: a checkpoint taken when the next
// token's draw is already out records the RNG from before that draw.
TEST(EngineAsync, TiersAndCheckpointsOverlapAndResumeWithTheUninterruptedTokens) {
  namespace fs = std::filesystem;
  ThreadPool pool(2);
  const fs::path dir = fs::temp_directory_path() / ("strata_async_tiers_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const std::vector<int32_t> prefix = test::random_ids(7, 16, kVocab);
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    r.id = "c" + std::to_string(i);
    r.prompt = prefix;
    const auto tail = test::random_ids(100 + uint64_t(i), 3 + i, kVocab);
    r.prompt.insert(r.prompt.end(), tail.begin(), tail.end());
    r.max_tokens = 40;
    r.ignore_eos = true;
    if (i % 2 == 0) {
      r.sampling.temperature = 0.8f;
      r.sampling.seed = 50 + uint64_t(i);
      r.sampling.has_seed = true;
    } else {
      r.sampling.temperature = 0.0f;
    }
    reqs.push_back(std::move(r));
  }
  auto durable = [&](EngineOptions& o) {
    o.kv_host_bytes = int64_t(1) << 16;  // a few dozen blocks
    o.kv_disk_dir = dir.string();
    o.kv_disk_bytes = int64_t(64) << 20;
    o.checkpoint_every = 4;
  };
  const Result ref = run_workload(pool, false, reqs, "", true);
  const Result on = run_workload(pool, true, reqs, "", true, true, durable);
  EXPECT_GT(on.stats.overlapped_steps, on.stats.steps / 2) << "tiers and checkpoints overlap";
  EXPECT_GT(on.stats.preemptions, 0) << "the small pool preempts";
  EXPECT_GT(on.stats.kv_tiers.demoted_blocks, 0) << "blocks were demoted";
  EXPECT_GT(on.stats.checkpoints.written + on.stats.checkpoints.coalesced, 0);
  EXPECT_GT(on.stats.checkpoint_blocks.staged, 0);
  // Every 4 tokens a checkpoint, at most 8 tokens apart on disk; one the writer could not keep
  // up with is replaced by the next (coalesced) or dropped, and counted: a gap spans one
  // interval more per one of those.
  const CheckpointWriterStats& cs = on.stats.checkpoints;
  EXPECT_LE(cs.max_gap_tokens, 4 * (2 + cs.coalesced + cs.dropped + cs.failed))
      << cs.written << " written, " << cs.coalesced << " coalesced, " << cs.dropped << " dropped, " << cs.failed << " failed";
  EXPECT_EQ(cs.failed, 0);
  for (const auto& q : reqs) {
    EXPECT_EQ(on.out.at(q.id).tokens, ref.out.at(q.id).tokens) << q.id;
    ASSERT_EQ(ref.out.at(q.id).tokens.size(), size_t(q.max_tokens)) << q.id;
  }

  // Stopped once every stream has 14 tokens (or has ended): the cancelled ones keep their
  // checkpoints.
  fs::remove_all(dir);
  auto build = [&]() {
    auto model = std::make_unique<HashModel>(pool);
    EngineOptions o;
    o.block_size = 4;
    o.kv_blocks = 48;
    o.max_num_seqs = 8;
    o.max_batch_tokens = 24;
    o.async_scheduling = true;
    o.model_identity = "hash";
    durable(o);
    auto layout = resolve_kv_layout(*model, KvCodecConfig{});
    EXPECT_TRUE(layout.ok());
    auto exec = std::make_unique<QueuedHostExecutor>(*model, *layout, o.kv_blocks, o.block_size, true);
    auto e = Engine::create(std::move(model), o, std::move(exec));
    EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.error().to_string());
    return e.ok() ? std::move(e).value() : nullptr;
  };
  {
    auto e = build();
    ASSERT_TRUE(e);
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (const auto& q : reqs) {
      auto s = e->submit(q);
      ASSERT_TRUE(s.ok());
      streams.push_back(*s);
    }
    e->start();
    for (size_t i = 0; i < streams.size(); ++i) {
      size_t n = 0;
      while (n < 14) {
        auto ev = streams[i]->next(std::chrono::seconds(60));
        ASSERT_TRUE(ev.has_value()) << reqs[i].id << " timed out";
        n += ev->tokens.size();
        if (ev->final) break;
      }
    }
    const EngineStats st = e->stats();
    EXPECT_GT(st.overlapped_steps, 0);
    e->shutdown();
  }
  auto e = build();
  ASSERT_TRUE(e);
  e->start();
  int resumed = 0;
  for (const auto& q : reqs) {
    auto s = e->submit(q);
    ASSERT_TRUE(s.ok());
    test::Outcome o;
    size_t first = 0;
    for (;;) {
      auto ev = (*s)->next(std::chrono::seconds(60));
      ASSERT_TRUE(ev.has_value()) << q.id << " timed out";
      if (first == 0) first = ev->tokens.size();
      o.tokens.insert(o.tokens.end(), ev->tokens.begin(), ev->tokens.end());
      if (ev->final) break;
    }
    EXPECT_EQ(o.tokens, ref.out.at(q.id).tokens) << q.id << " resumed from " << first << " tokens";
    if (first >= 4) ++resumed;
  }
  EXPECT_GT(resumed, 0) << "no request resumed from a checkpoint";
  EXPECT_GT(e->stats().kv_tiers.disk_hit_blocks, 0) << "the checkpointed KV came from disk";
  e->shutdown();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace strata
