// CudaExecutor's overlapped steps (StepExecutor::enqueue / collect). Per step, in stream order:
// the feed descriptor's upload (the decodes whose input is the previous step's token), the
// decoder's step (its metadata upload, then the feed kernel, then the layers: a decode graph
// replays both), the device sampler, the merge of every row's token into one buffer, and that
// buffer's copy into the step's pinned slot, with the logprobs of the rows that ask for them.
// collect() waits for the copies; the next step's feed kernel reads the same buffer on the
// device before the next merge overwrites it, and so does the device sampler: a fed row with
// penalties counts the previous step's token (SamplingRow::pending), which its host sampler
// accepts only when that step is collected, after this one was queued. Two slots of pinned
// memory: a step's slot is reused two steps later, after it was collected.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "backend/cuda/token_feed.h"
#include "core/check.h"
#include "core/log.h"
#include "runtime/cuda/cuda_executor.h"

namespace strata::cuda {

using Clock = std::chrono::steady_clock;

struct CudaExecutorOverlap {
  int32_t max_seqs = 0, max_rows = 0;
  int32_t* d_desc = nullptr;    // [1 + 2 * max_seqs] feed descriptor (CudaDecoder::set_token_feed)
  int32_t* d_tokens = nullptr;  // [max_rows] the last merged step's token of each row
  struct Slot {
    int32_t* h_desc = nullptr;        // pinned [1 + 2 * max_seqs]
    int32_t* h_row_sample = nullptr;  // pinned [max_rows]: sampled-token index of each row, -1: argmax
    int32_t* h_tokens = nullptr;      // pinned [max_rows]: the step's tokens, copied back
    uint8_t* h_stage = nullptr;       // pinned [stage_bytes]: device sampler uploads (rows, lists)
    size_t stage_bytes = 0;           // grows with the penalty lists of the steps queued
    void* h_logprobs = nullptr;       // pinned LogprobsHost::bytes(max_rows): the step's logprobs
    LogprobsHost lp;                  // views into h_logprobs, by sampled row
    std::vector<int32_t> lp_top_n;    // [sampled rows] their top_logprobs; empty: none asked
    int32_t* d_row_sample = nullptr;  // [max_rows]
    cudaEvent_t done = nullptr;       // after the tokens' copy
    int64_t number = 0;               // the step's place among overlapped steps (profiling)
    int32_t n_rows = 0;
    int64_t n_tokens = 0;
    int32_t n_sampled = 0;
    double enqueue_ms = 0;
  };
  Slot slot[2];
  int32_t head = 0, queued = 0;
  int32_t last_rows = -1;  // rows of the last enqueued step (-1: none, or a run() since)
  bool deferred = false;   // the newest step waits for sample_enqueued() (masks_later)
  std::vector<TokenMask> no_masks;
  // STRATA_PROFILE_STEPS: timed events before and after each step's work, a ring indexed by
  // the step's number (an event is recorded again four steps on, after both its readers), and
  // sums over the steps since the last log line.
  static constexpr int kRing = 4;
  cudaEvent_t begin[kRing] = {}, end[kRing] = {};
  int64_t n_enqueued = 0;
  int64_t chain_from = 0;  // first step after the last run(): idle is measured from the next one
  int64_t prof_steps = 0, prof_tokens = 0;
  double prof_idle_ms = 0, prof_busy_ms = 0, prof_enqueue_ms = 0, prof_wait_ms = 0, prof_wall_ms = 0;
  Clock::time_point prof_last_collect{};
  bool prof_have_last = false;
};

namespace {

void free_overlap(CudaExecutorOverlap& o) {
  for (auto& sl : o.slot) {
    cudaFreeHost(sl.h_desc);
    cudaFreeHost(sl.h_stage);
    cudaFreeHost(sl.h_logprobs);
    cudaFree(sl.d_row_sample);
    if (sl.done) cudaEventDestroy(sl.done);
  }
  for (int i = 0; i < CudaExecutorOverlap::kRing; ++i) {
    if (o.begin[i]) cudaEventDestroy(o.begin[i]);
    if (o.end[i]) cudaEventDestroy(o.end[i]);
  }
  cudaFree(o.d_desc);
  cudaFree(o.d_tokens);
}

}  // namespace

void CudaExecutorOverlapFree::operator()(CudaExecutorOverlap* o) const {
  free_overlap(*o);
  delete o;
}

CudaExecutor::~CudaExecutor() {
  // Copies into the pinned slots may be in flight.
  if (overlap_) cudaStreamSynchronize(decoder_->stream());
}

int32_t CudaExecutor::overlap_queued() const { return overlap_ ? overlap_->queued : 0; }

void CudaExecutor::overlap_interrupted() {
  if (!overlap_) return;
  overlap_->last_rows = -1;  // the merged tokens are no longer the previous step's
  overlap_->chain_from = overlap_->n_enqueued + 1;
  overlap_->prof_have_last = false;
}

void CudaExecutor::setup_overlap() {
  auto o = std::make_unique<CudaExecutorOverlap>();
  const CudaModelOptions& mo = decoder_->options();
  o->max_seqs = mo.max_seqs;
  o->max_rows = int32_t(mo.max_logit_rows);
  // Sampler uploads: at first a SamplingRow per row and up to 1024 logit_bias entries per row
  // (the scratch's capacity, sampling_bias_capacity), each piece aligned to 256 bytes; a step
  // whose penalty lists need more grows its slot's (ensure_stage).
  const size_t stage_bytes = size_t(o->max_rows) * (sizeof(SamplingRow) + 1024 * 8) + 8 * 256;
  const size_t desc = size_t(1 + 2 * o->max_seqs) * 4;
  const size_t rows = size_t(o->max_rows) * 4;
  bool ok = cudaMalloc(reinterpret_cast<void**>(&o->d_desc), desc) == cudaSuccess &&
            cudaMalloc(reinterpret_cast<void**>(&o->d_tokens), rows) == cudaSuccess &&
            cudaMemset(o->d_desc, 0, desc) == cudaSuccess && cudaMemset(o->d_tokens, 0, rows) == cudaSuccess;
  for (auto& sl : o->slot) {
    void* h = nullptr;
    ok = ok && cudaMallocHost(&h, desc + 2 * rows) == cudaSuccess;
    if (ok) {
      sl.h_desc = static_cast<int32_t*>(h);
      sl.h_row_sample = sl.h_desc + (1 + 2 * o->max_seqs);
      sl.h_tokens = sl.h_row_sample + o->max_rows;
    }
    void* st = nullptr;
    ok = ok && cudaMallocHost(&st, stage_bytes) == cudaSuccess;
    if (ok) {
      sl.h_stage = static_cast<uint8_t*>(st);
      sl.stage_bytes = stage_bytes;
    }
    ok = ok && cudaMallocHost(&sl.h_logprobs, LogprobsHost::bytes(o->max_rows)) == cudaSuccess;
    if (ok) sl.lp = LogprobsHost::at(sl.h_logprobs, o->max_rows);
    ok = ok && cudaMalloc(reinterpret_cast<void**>(&sl.d_row_sample), rows) == cudaSuccess;
    ok = ok && cudaEventCreateWithFlags(&sl.done, cudaEventDisableTiming) == cudaSuccess;
  }
  for (int i = 0; i < CudaExecutorOverlap::kRing; ++i) {
    ok = ok && cudaEventCreate(&o->begin[i]) == cudaSuccess && cudaEventCreate(&o->end[i]) == cudaSuccess;
  }
  ok = ok && cudaDeviceSynchronize() == cudaSuccess;
  if (!ok) {
    cudaGetLastError();  // not sticky: later calls must not see it
    log::warn("overlapped steps off: their device and pinned buffers could not be allocated");
    free_overlap(*o);
    return;
  }
  overlap_.reset(o.release());
  decoder_->set_token_feed(overlap_->d_desc, overlap_->d_tokens);
}

size_t CudaExecutor::sampling_stage_bytes(std::span<const RowSample> samples) const {
  // As launch_device_sampling fills the lists: penalty lists only where their penalty is on.
  size_t rows = 0, bias = 0, seen = 0, counts = 0, masked = 0;
  for (const RowSample& r : samples) {
    if (r.sampler == nullptr) continue;
    const SamplingParams& p = r.sampler->params();
    ++rows;
    if (r.mask.words != nullptr || r.mask_later) ++masked;
    bias += p.logit_bias.size();
    if (p.repetition_penalty != 1.0f) seen += r.sampler->seen_ids().size();
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) counts += r.sampler->token_counts().size();
  }
  return rows * sizeof(SamplingRow) + bias * 8 + seen * 4 + counts * 8 + masked * size_t(sampling_->mask_words) * 4 + 7 * 256;
}

namespace {

// Room for `bytes` of sampler uploads in the slot's pinned staging. The slot's earlier step
// was collected (its copies are done), so its buffer may go; grows by half again at least, so
// a growing context reallocates rarely.
void ensure_stage(CudaExecutorOverlap::Slot& sl, size_t bytes) {
  if (bytes <= sl.stage_bytes) return;
  const size_t want = std::max(bytes, sl.stage_bytes + sl.stage_bytes / 2);
  void* p = nullptr;
  if (cudaMallocHost(&p, want) != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error("CUDA step: pinned staging of " + std::to_string(want) + " bytes for the sampler's penalty lists");
  }
  cudaFreeHost(sl.h_stage);
  sl.h_stage = static_cast<uint8_t*>(p);
  sl.stage_bytes = want;
}

}  // namespace

void CudaExecutor::enqueue(const StepPlan& plan, const std::vector<uint8_t>& want_logits,
                           std::span<const RowSample> samples, std::span<const TokenFeed> feed, bool masks_later) {
  STRATA_CHECK(overlap_ != nullptr, "enqueue() without overlapped steps");
  CudaExecutorOverlap& o = *overlap_;
  if (o.queued >= 2) throw std::logic_error("CUDA step: two overlapped steps are queued already");
  if (o.deferred) throw std::logic_error("CUDA step: the previous step waits for its masks (sample_enqueued)");
  const Clock::time_point t0 = Clock::now();
  const int32_t slot = (o.head + o.queued) % 2;
  CudaExecutorOverlap::Slot& sl = o.slot[slot];
  const cudaStream_t stream = decoder_->stream();
  pack(plan);
  const int64_t n_rows = batch_.n_logit_rows();
  if (int64_t(want_logits.size()) != n_rows || std::any_of(want_logits.begin(), want_logits.end(), [](uint8_t w) { return w != 0; })) {
    throw std::invalid_argument("CUDA step: an overlapped step has no host logit rows");
  }
  if (!samples.empty() && int64_t(samples.size()) != n_rows) throw std::invalid_argument("CUDA step: samples has one entry per logit row");
  if (n_rows > o.max_rows || int64_t(feed.size()) > o.max_seqs) throw std::invalid_argument("CUDA step: too many rows or fed spans");
  // Feed: the index of each fed span's token in the step's token ids. The fed span's logit
  // row (its sampler has not seen the fed token yet) takes the token into its penalties.
  sl.h_desc[0] = int32_t(feed.size());
  pending_.assign(size_t(n_rows), -1);
  if (!feed.empty()) {
    if (o.last_rows < 0) throw std::logic_error("CUDA step: a feed without a previous overlapped step");
    std::vector<int32_t> first(plan.spans.size() + 1, 0);
    std::vector<int32_t> row_of(plan.spans.size(), -1);  // the logit row of one-row spans
    int32_t rows = 0;
    for (size_t i = 0; i < plan.spans.size(); ++i) {
      const ScheduledSpan& sp = plan.spans[i];
      first[i + 1] = first[i] + sp.n_tokens;
      if (sp.logits_all) {
        rows += sp.n_tokens;
      } else if (sp.sample) {
        row_of[i] = rows++;
      }
    }
    for (size_t k = 0; k < feed.size(); ++k) {
      const TokenFeed& f = feed[k];
      if (f.span < 0 || size_t(f.span) >= plan.spans.size() || plan.spans[size_t(f.span)].n_tokens != 1 || f.prev_row < 0 ||
          f.prev_row >= o.last_rows) {
        throw std::invalid_argument("CUDA step: feed " + std::to_string(k) + " (span " + std::to_string(f.span) + ", row " +
                                    std::to_string(f.prev_row) + ") does not name a one-token span and a previous row");
      }
      sl.h_desc[1 + k] = f.prev_row;
      sl.h_desc[1 + o.max_seqs + k] = first[size_t(f.span)];
      const int32_t r = row_of[size_t(f.span)];
      if (r >= 0 && r < n_rows) pending_[size_t(r)] = f.prev_row;
    }
  }
  int32_t n_sampled = 0;
  for (int64_t r = 0; r < n_rows; ++r) {
    const bool dev = !samples.empty() && samples[size_t(r)].sampler != nullptr;
    sl.h_row_sample[r] = dev ? n_sampled++ : -1;
  }
  if (n_sampled > 0 && sampling_ == nullptr) throw std::logic_error("CUDA step: rows handed for device sampling without its scratch");
  if (n_sampled > 0) ensure_stage(sl, sampling_stage_bytes(samples));
  auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA step: ") + what + ": " + cudaGetErrorString(e));
  };
  const int64_t number = o.n_enqueued;
  if (profile_) check(cudaEventRecord(o.begin[number % CudaExecutorOverlap::kRing], stream), "event");
  const size_t desc_bytes = size_t(1 + 2 * o.max_seqs) * 4;
  if (!feed.empty()) check(cudaMemcpyAsync(o.d_desc, sl.h_desc, desc_bytes, cudaMemcpyHostToDevice, stream), "feed upload");
  Status st = decoder_->enqueue(batch_);
  if (!st.ok()) {
    cudaMemsetAsync(o.d_desc, 0, 4, stream);  // no later step may take this feed
    throw std::runtime_error("CUDA step: " + st.error().to_string());
  }
  sl.n_rows = int32_t(n_rows);
  sl.n_sampled = n_sampled;
  sl.n_tokens = batch_.n_tokens();
  sl.number = number;
  sl.enqueue_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  o.last_rows = int32_t(n_rows);
  ++o.queued;
  try {
    if (n_sampled > 0 && batch_.n_tokens() > 0) prepare_device_sampling(samples, pending_);
    if (masks_later) {
      o.deferred = true;  // the forward runs; sample_enqueued() queues the rest
      return;
    }
    std::vector<TokenMask>& masks = sampling_ ? sampling_->by_row : o.no_masks;
    masks.assign(samples.size(), TokenMask{});
    for (size_t r = 0; r < samples.size(); ++r) masks[r] = samples[r].mask;
    finish_enqueue(slot, masks);
  } catch (...) {
    abandon_enqueued();
    throw;
  }
}

void CudaExecutor::sample_enqueued(std::span<const TokenMask> masks) {
  STRATA_CHECK(overlap_ != nullptr && overlap_->deferred, "sample_enqueued() without a step enqueued with masks_later");
  CudaExecutorOverlap& o = *overlap_;
  o.deferred = false;
  const Clock::time_point t0 = Clock::now();
  const int32_t slot = (o.head + o.queued - 1) % 2;
  CudaExecutorOverlap::Slot& sl = o.slot[slot];
  try {
    if (!masks.empty() && int32_t(masks.size()) != sl.n_rows) throw std::invalid_argument("CUDA step: masks has one entry per logit row");
    finish_enqueue(slot, masks);
  } catch (...) {
    abandon_enqueued();
    throw;
  }
  sl.enqueue_ms += std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// A step whose second half failed: it leaves the queue (nothing will collect it) and no later
// step may take its tokens.
void CudaExecutor::abandon_enqueued() {
  CudaExecutorOverlap& o = *overlap_;
  o.deferred = false;
  --o.queued;
  o.last_rows = -1;
  o.chain_from = o.n_enqueued + 1;
  cudaMemsetAsync(o.d_desc, 0, 4, decoder_->stream());
}

// The second half of a queued step: its sampling (the lists prepare_device_sampling made, the
// masks), the merge of every row's token, the copies back and the step's events.
void CudaExecutor::finish_enqueue(int32_t slot, std::span<const TokenMask> masks) {
  CudaExecutorOverlap& o = *overlap_;
  CudaExecutorOverlap::Slot& sl = o.slot[slot];
  const cudaStream_t stream = decoder_->stream();
  auto check = [](cudaError_t e, const char* what) {
    if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA step: ") + what + ": " + cudaGetErrorString(e));
  };
  const int64_t n_rows = sl.n_rows;
  const int32_t n_sampled = sl.n_sampled;
  const int64_t number = sl.number;
  if (n_sampled > 0 && sl.n_tokens > 0) {
    // The sampler runs before this step's merge: o.d_tokens still holds the previous step's.
    launch_prepared_sampling(masks, sl.h_stage, o.d_tokens);
  }
  if (n_rows > 0) {
    check(cudaMemcpyAsync(sl.d_row_sample, sl.h_row_sample, size_t(n_rows) * 4, cudaMemcpyHostToDevice, stream), "row upload");
    MergeTokensArgs m;
    m.argmax = decoder_->device_argmax();
    m.sampled = sampling_ ? sampling_->tokens : nullptr;
    m.row_sample = sl.d_row_sample;
    m.tokens = o.d_tokens;
    m.n_rows = int32_t(n_rows);
    launch_merge_tokens(m, stream);
    check(cudaMemcpyAsync(sl.h_tokens, o.d_tokens, size_t(n_rows) * 4, cudaMemcpyDeviceToHost, stream), "token copy");
  }
  sl.lp_top_n.clear();
  if (logprobs_ && n_sampled > 0 && sl.n_tokens > 0) {
    logprobs_->copy_out(sampling_->h_rows, sl.lp, sl.lp_top_n, stream);
  }
  if (profile_) check(cudaEventRecord(o.end[number % CudaExecutorOverlap::kRing], stream), "event");
  check(cudaEventRecord(sl.done, stream), "event");
  ++o.n_enqueued;
}

const StepRows& CudaExecutor::collect() {
  STRATA_CHECK(overlap_ != nullptr && overlap_->queued > 0, "collect() with no overlapped step queued");
  CudaExecutorOverlap& o = *overlap_;
  if (o.deferred && o.queued == 1) throw std::logic_error("CUDA step: collect() of a step that waits for its masks");
  CudaExecutorOverlap::Slot& sl = o.slot[o.head];
  o.head = (o.head + 1) % 2;
  --o.queued;
  const Clock::time_point t0 = Clock::now();
  const cudaError_t e = cudaEventSynchronize(sl.done);
  if (e != cudaSuccess) throw std::runtime_error(std::string("CUDA step: ") + cudaGetErrorString(e));
  const Clock::time_point t1 = Clock::now();
  const size_t n = size_t(sl.n_rows);
  rows_.logits = nullptr;
  rows_.host_row.assign(n, -1);
  rows_.argmax.assign(sl.h_tokens, sl.h_tokens + n);
  rows_.sampled.assign(n, StepRows::kNotSampled);
  for (size_t r = 0; r < n; ++r) {
    if (sl.h_row_sample[r] >= 0) rows_.sampled[r] = sl.h_tokens[r];
  }
  std::vector<int32_t> logit_row(sl.lp_top_n.size(), 0);  // of each sampled row
  for (size_t r = 0; r < n && !logit_row.empty(); ++r) {
    const int32_t k = sl.h_row_sample[r];
    if (k >= 0 && size_t(k) < logit_row.size()) logit_row[size_t(k)] = int32_t(r);
  }
  hand_logprobs(rows_, n, logit_row, sl.lp_top_n, sl.lp);
  if (profile_) {
    auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    const int64_t k = sl.number;
    float busy = 0, idle = 0;
    cudaEventElapsedTime(&busy, o.begin[k % CudaExecutorOverlap::kRing], o.end[k % CudaExecutorOverlap::kRing]);
    // From the previous step's end to this one's begin: 0 when this step was queued before the
    // previous one ended.
    if (k > o.chain_from) cudaEventElapsedTime(&idle, o.end[(k - 1) % CudaExecutorOverlap::kRing], o.begin[k % CudaExecutorOverlap::kRing]);
    cudaGetLastError();
    o.prof_busy_ms += busy;
    o.prof_idle_ms += std::max(idle, 0.0f);
    o.prof_enqueue_ms += sl.enqueue_ms;
    o.prof_wait_ms += ms(t0, t1);
    if (o.prof_have_last) o.prof_wall_ms += ms(o.prof_last_collect, t1);
    o.prof_last_collect = t1;
    o.prof_have_last = true;
    o.prof_tokens += sl.n_tokens;
    if (++o.prof_steps % 256 == 0) {
      const double m = 256.0;
      log::info("CUDA overlapped steps {}: per step {:.3f} ms device idle between steps and {:.3f} ms device step "
                "(event-timed); host {:.3f} ms per step between collects, of which {:.3f} ms packing and queueing "
                "the next step, {:.3f} ms waiting for this step's tokens, the rest engine work (planning, commit, "
                "streaming) done while the device runs; {:.1f} tokens per step",
                o.prof_steps, o.prof_idle_ms / m, o.prof_busy_ms / m, o.prof_wall_ms / m, o.prof_enqueue_ms / m,
                o.prof_wait_ms / m, double(o.prof_tokens) / m);
      o.prof_idle_ms = o.prof_busy_ms = o.prof_enqueue_ms = o.prof_wait_ms = o.prof_wall_ms = 0;
      o.prof_tokens = 0;
    }
  }
  return rows_;
}

}  // namespace strata::cuda
