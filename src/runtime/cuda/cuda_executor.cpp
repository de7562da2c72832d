#include "runtime/cuda/cuda_executor.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "core/check.h"
#include "core/log.h"
#include "core/thread_pool.h"
#include "kv/kv_plan.h"
#include "model/qwen3_next.h"
#include "model/registry.h"
#include "model/safetensors.h"
#include "runtime/cuda/cuda_family.h"
#include "runtime/cuda/cuda_hybrid.h"
#include "runtime/cuda/weight_split.h"

namespace strata::cuda {

namespace {

// The Engine's view of a model whose forward runs on the device: shapes only (the decoder's
// layouts: no KV and recurrent state in the hybrids' linear-attention layers).
class ShapeModel final : public Model {
 public:
  explicit ShapeModel(const CudaDecoder& d)
      : Model(d.config(), pool()), kv_(d.kv_layout()), state_(d.state_layout()) {}
  std::vector<KvLayerSpec> kv_layout() const override { return kv_; }
  std::vector<StateLayerSpec> state_layout() const override { return state_; }
  void forward(const StepBatch&, KvStorage&, StateStorage*, float*) override {
    throw std::logic_error("the device model's forward runs in CudaExecutor");
  }

 private:
  std::vector<KvLayerSpec> kv_;
  std::vector<StateLayerSpec> state_;
  static ThreadPool& pool() {
    static ThreadPool p(1);
    return p;
  }
};

// Device sampling scratch (CudaExecutor::Sampling): penalty lists cover every row's whole
// context (a row's seen ids and counts are at most its context length), capped at 16M ids;
// logit_bias takes up to 1024 entries per row.
int64_t sampling_list_capacity(const CudaModelOptions& o) {
  return std::min<int64_t>(int64_t(o.max_logit_rows) * o.max_blocks_per_seq * o.block_size, int64_t(1) << 24);
}
int64_t sampling_bias_capacity(const CudaModelOptions& o) { return int64_t(o.max_logit_rows) * 1024; }
// Grammar masks: one row of words per logit row, the vocabulary rounded up to 32 ids.
int32_t sampling_mask_words(int32_t vocab) { return (vocab + 31) / 32; }
// Bytes of the arena: workspace, rows and tokens, three id lists, bias ids and values, the
// masks, and alignment slack for the nine pieces.
size_t sampling_scratch_bytes(const CudaModelOptions& o, int32_t vocab) {
  return sampling_workspace_bytes(o.max_logit_rows, vocab) + size_t(o.max_logit_rows) * (sizeof(SamplingRow) + 4) +
         size_t(sampling_list_capacity(o)) * 12 + size_t(sampling_bias_capacity(o)) * 8 +
         size_t(o.max_logit_rows) * size_t(sampling_mask_words(vocab)) * 4 + 9 * 256;
}

}  // namespace

CudaExecutor::CudaExecutor(std::unique_ptr<CudaDecoder> decoder, int64_t kv_staging_bytes)
    : decoder_(std::move(decoder)) {
  auto t = KvTransfer::create(decoder_->kv_pool(), decoder_->stream(), kv_staging_bytes);
  if (t.ok()) {
    transfer_ = std::move(t).value();
  } else {
    cudaGetLastError();  // the failed allocation must not surface as a later launch error
    log::warn("KV block staging ({} bytes) not allocated, KV blocks move one at a time: {}", kv_staging_bytes,
              t.error().to_string());
  }
  const char* p = std::getenv("STRATA_PROFILE_STEPS");
  profile_ = p != nullptr && std::string(p) == "1";

  // Device sampling scratch (sizes: sampling_scratch_bytes).
  const CudaModelOptions& o = decoder_->options();
  const int32_t vocab = decoder_->config().vocab_size;
  auto s = std::make_unique<Sampling>();
  s->max_rows = o.max_logit_rows;
  s->list_capacity = sampling_list_capacity(o);
  s->bias_capacity = sampling_bias_capacity(o);
  s->workspace_bytes = sampling_workspace_bytes(o.max_logit_rows, vocab);
  const size_t rows = size_t(s->max_rows), lists = size_t(s->list_capacity), bias = size_t(s->bias_capacity);
  const size_t bytes = sampling_scratch_bytes(o, vocab);
  Status st = [&]() -> Status {
    auto arena = DeviceArena::create(bytes, "device sampling");
    if (!arena.ok()) return arena.error();
    s->arena = std::move(arena).value();
    DeviceArena& a = *s->arena;
    auto take = [&](auto** out, size_t n, const char* what) -> Status {
      using T = std::remove_pointer_t<std::remove_reference_t<decltype(*out)>>;
      auto r = a.take_array<T>(n, what);
      if (!r.ok()) return r.error();
      *out = *r;
      return Status();
    };
    auto ws = a.take(s->workspace_bytes, "sampling workspace");
    if (!ws.ok()) return ws.error();
    s->workspace = *ws;
    STRATA_RETURN_IF_ERROR(take(&s->rows, rows, "sampling rows"));
    STRATA_RETURN_IF_ERROR(take(&s->tokens, rows, "sampled tokens"));
    STRATA_RETURN_IF_ERROR(take(&s->seen_ids, lists, "repetition ids"));
    STRATA_RETURN_IF_ERROR(take(&s->count_ids, lists, "penalty ids"));
    STRATA_RETURN_IF_ERROR(take(&s->count_values, lists, "penalty counts"));
    STRATA_RETURN_IF_ERROR(take(&s->bias_ids, bias, "logit bias ids"));
    STRATA_RETURN_IF_ERROR(take(&s->bias_values, bias, "logit bias values"));
    s->mask_words = sampling_mask_words(vocab);
    STRATA_RETURN_IF_ERROR(take(&s->masks, rows * size_t(s->mask_words), "grammar masks"));
    return Status();
  }();
  if (st.ok()) {
    sampling_ = std::move(s);
    logprobs_ = DeviceLogprobs::create(int32_t(sampling_->max_rows));
  } else {
    cudaGetLastError();
    log::warn("device sampling scratch ({} bytes) not allocated, sampled rows copy their logits to the host: {}", bytes,
              st.error().to_string());
  }
  setup_overlap();
}

void CudaExecutor::launch_device_sampling(std::span<const RowSample> samples, uint8_t* pinned,
                                          std::span<const int32_t> pending, const int32_t* pending_tokens) {
  prepare_device_sampling(samples, pending);
  std::vector<TokenMask>& masks = sampling_->by_row;
  masks.assign(samples.size(), TokenMask{});
  for (size_t r = 0; r < samples.size(); ++r) masks[r] = samples[r].mask;
  launch_prepared_sampling(masks, pinned, pending_tokens);
}

void CudaExecutor::prepare_device_sampling(std::span<const RowSample> samples, std::span<const int32_t> pending) {
  Sampling& s = *sampling_;
  s.h_rows.clear();
  s.h_row_index.clear();
  s.h_bias_ids.clear();
  s.h_bias_values.clear();
  s.h_seen.clear();
  s.h_count_ids.clear();
  s.h_count_values.clear();
  for (size_t r = 0; r < samples.size(); ++r) {
    const Sampler* sampler = samples[r].sampler;
    if (sampler == nullptr) continue;
    const SamplingParams& p = sampler->params();
    SamplingRow row = sampling_row(p);
    row.draw = samples[r].draw;
    row.top_logprobs = logprobs_ ? samples[r].top_logprobs : -1;
    row.bias_begin = int32_t(s.h_bias_ids.size());
    for (const auto& [id, v] : p.logit_bias) {
      s.h_bias_ids.push_back(id);
      s.h_bias_values.push_back(v);
    }
    row.bias_count = int32_t(s.h_bias_ids.size()) - row.bias_begin;
    // The penalty lists only where their penalty is on (the sampler reads them only then).
    row.seen_begin = int32_t(s.h_seen.size());
    if (p.repetition_penalty != 1.0f) {
      for (int32_t id : sampler->seen_ids()) s.h_seen.push_back(id);
    }
    row.seen_count = int32_t(s.h_seen.size()) - row.seen_begin;
    row.counts_begin = int32_t(s.h_count_ids.size());
    if (p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f) {
      for (const auto& [id, n] : sampler->token_counts()) {
        s.h_count_ids.push_back(id);
        s.h_count_values.push_back(n);
      }
    }
    row.counts_count = int32_t(s.h_count_ids.size()) - row.counts_begin;
    const bool penalties = p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
    if (penalties && r < pending.size()) row.pending = pending[r];
    s.h_rows.push_back(row);
    s.h_row_index.push_back(int32_t(r));
  }
  if (int64_t(s.h_rows.size()) > s.max_rows || int64_t(s.h_seen.size()) > s.list_capacity ||
      int64_t(s.h_count_ids.size()) > s.list_capacity || int64_t(s.h_bias_ids.size()) > s.bias_capacity) {
    throw std::runtime_error("device sampling: the step's rows (" + std::to_string(s.h_rows.size()) + "), penalty ids (" +
                             std::to_string(s.h_seen.size()) + ", " + std::to_string(s.h_count_ids.size()) +
                             ") or logit_bias entries (" + std::to_string(s.h_bias_ids.size()) + ") pass the scratch's capacity");
  }
}

void CudaExecutor::launch_prepared_sampling(std::span<const TokenMask> masks, uint8_t* pinned, const int32_t* pending_tokens) {
  Sampling& s = *sampling_;
  if (s.h_rows.empty()) return;
  const int32_t vocab = decoder_->config().vocab_size;
  // Each masked row's words, bits past its n_ids (and past the vocabulary) cleared, as the host
  // Sampler leaves those ids out.
  s.h_masks.clear();
  int32_t n_masked = 0;
  for (size_t i = 0; i < s.h_rows.size(); ++i) {
    const size_t r = size_t(s.h_row_index[i]);
    s.h_rows[i].mask = -1;
    if (r >= masks.size() || masks[r].words == nullptr) continue;
    const int32_t n_ids = std::clamp(masks[r].n_ids, 0, vocab);
    const size_t at = s.h_masks.size();
    s.h_masks.resize(at + size_t(s.mask_words), 0u);
    const int32_t full = n_ids / 32;
    std::memcpy(s.h_masks.data() + at, masks[r].words, size_t(full) * 4);
    if (n_ids % 32 != 0) s.h_masks[at + size_t(full)] = masks[r].words[full] & ((1u << (n_ids % 32)) - 1u);
    s.h_rows[i].mask = n_masked++;
  }
  // The sampler reads row i of its batch as logits row h_row_index[i]: rows are packed so
  // that each sampled row's logits stay where the step wrote them (stride = vocab, base at
  // the row), one launch per run of consecutive rows.
  const cudaStream_t stream = decoder_->stream();
  // Staged through pinned memory (overlapped steps: sampling_stage_bytes() of room), a copy
  // never waits for the device.
  size_t staged = 0;
  auto up = [&](void* dst, const void* src, size_t bytes) {
    if (bytes == 0) return;
    if (pinned != nullptr) {
      std::memcpy(pinned + staged, src, bytes);
      src = pinned + staged;
      staged += (bytes + 255) / 256 * 256;
    }
    if (cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream) != cudaSuccess) {
      throw std::runtime_error("device sampling: upload failed");
    }
  };
  up(s.rows, s.h_rows.data(), s.h_rows.size() * sizeof(SamplingRow));
  up(s.bias_ids, s.h_bias_ids.data(), s.h_bias_ids.size() * 4);
  up(s.bias_values, s.h_bias_values.data(), s.h_bias_values.size() * 4);
  up(s.seen_ids, s.h_seen.data(), s.h_seen.size() * 4);
  up(s.count_ids, s.h_count_ids.data(), s.h_count_ids.size() * 4);
  up(s.count_values, s.h_count_values.data(), s.h_count_values.size() * 4);
  up(s.masks, s.h_masks.data(), s.h_masks.size() * 4);
  const float* logits = decoder_->device_logits();
  for (size_t i = 0; i < s.h_rows.size();) {
    size_t j = i + 1;
    while (j < s.h_rows.size() && s.h_row_index[j] == s.h_row_index[j - 1] + 1) ++j;
    SamplingBatch b;
    b.logits = logits + size_t(s.h_row_index[i]) * size_t(vocab);
    b.logits_stride = vocab;
    b.n_rows = int32_t(j - i);
    b.vocab = vocab;
    b.rows = s.rows + i;
    b.bias_ids = s.bias_ids;
    b.bias_values = s.bias_values;
    b.seen_ids = s.seen_ids;
    b.count_ids = s.count_ids;
    b.count_values = s.count_values;
    b.pending_tokens = pending_tokens;
    b.masks = n_masked > 0 ? s.masks : nullptr;
    b.mask_words = s.mask_words;
    b.tokens = s.tokens + i;
    b.workspace = s.workspace;
    b.workspace_bytes = s.workspace_bytes;
    if (logprobs_) logprobs_->attach(b, int32_t(i));
    launch_sampling(b, stream);
    i = j;
  }
  if (pinned != nullptr) return;  // the tokens stay on the device (CudaExecutor::enqueue)
  s.h_tokens.resize(s.h_rows.size());
  if (cudaMemcpyAsync(s.h_tokens.data(), s.tokens, s.h_rows.size() * 4, cudaMemcpyDeviceToHost, stream) != cudaSuccess) {
    throw std::runtime_error("device sampling: token copy failed");
  }
  if (logprobs_) logprobs_->copy_out(s.h_rows, logprobs_->host(), logprobs_->host_top_n(), stream);
}

void CudaExecutor::pack(const StepPlan& plan) {
  batch_.tokens.clear();
  batch_.seqs.resize(plan.spans.size());
  for (size_t i = 0; i < plan.spans.size(); ++i) {
    const ScheduledSpan& span = plan.spans[i];
    const Sequence& seq = *span.seq;
    STRATA_CHECK(int64_t(span.pos0) + span.n_tokens <= seq.n_tokens(), "span past the sequence's tokens");
    batch_.tokens.insert(batch_.tokens.end(), seq.tokens.begin() + span.pos0, seq.tokens.begin() + span.pos0 + span.n_tokens);
    SeqSpan& s = batch_.seqs[i];
    s.n_tokens = span.n_tokens;
    s.pos0 = span.pos0;
    s.block_table.assign(seq.blocks.begin(), seq.blocks.end());
    if (decoder_->n_kv_window_blocks() > 0) {
      s.window_block_table.assign(seq.window_blocks.begin(), seq.window_blocks.end());
    } else {
      s.window_block_table.clear();
    }
    s.state_slot = seq.state_slot;
    s.n_quant_blocks = seq.n_quant_blocks;
    s.logits_last = span.sample;
    s.logits_all = span.logits_all;
  }
}

void CudaExecutor::convert_kv_blocks(std::span<const int32_t> src, std::span<const int32_t> dst) {
  const Status st = decoder_->convert_kv_blocks(src, dst);
  if (!st.ok()) throw std::runtime_error("--kv-quant-start: " + st.error().to_string());
}

const StepRows& CudaExecutor::run(const StepPlan& plan, const std::vector<uint8_t>& want_logits,
                                  std::span<const RowSample> samples) {
  using Clock = std::chrono::steady_clock;
  STRATA_CHECK(overlap_queued() == 0, "run() with overlapped steps still queued");
  overlap_interrupted();
  const Clock::time_point t0 = profile_ ? Clock::now() : Clock::time_point{};
  pack(plan);
  const int64_t n_rows = batch_.n_logit_rows();
  STRATA_CHECK(int64_t(want_logits.size()) == n_rows, "want_logits has one entry per logit row");
  host_rows_.clear();
  rows_.host_row.assign(size_t(n_rows), -1);
  for (int64_t r = 0; r < n_rows; ++r) {
    if (want_logits[size_t(r)] == 0) continue;
    rows_.host_row[size_t(r)] = int32_t(host_rows_.size());
    host_rows_.push_back(int32_t(r));
  }
  const size_t vocab = size_t(decoder_->config().vocab_size);
  if (logits_.size() < host_rows_.size() * vocab) logits_.resize(host_rows_.size() * vocab);
  rows_.argmax.resize(size_t(n_rows));
  const Clock::time_point t1 = profile_ ? Clock::now() : Clock::time_point{};
  STRATA_CHECK(samples.empty() || int64_t(samples.size()) == n_rows, "samples has one entry per logit row");
  const bool any_sample =
      std::any_of(samples.begin(), samples.end(), [](const RowSample& x) { return x.sampler != nullptr; });
  STRATA_CHECK(!any_sample || sampling_ != nullptr, "rows handed for device sampling without its scratch");
  Status st = decoder_->enqueue(batch_);
  if (!st.ok()) throw std::runtime_error("CUDA step: " + st.error().to_string());
  // The sampler and its token copy are queued before fetch_rows' copies and synchronize.
  const bool sampled = any_sample && batch_.n_tokens() > 0;
  if (sampled) launch_device_sampling(samples);
  st = decoder_->fetch_rows(rows_.argmax.data(), host_rows_.data(), int64_t(host_rows_.size()), logits_.data());
  if (!st.ok()) throw std::runtime_error("CUDA step: " + st.error().to_string());
  rows_.sampled.assign(size_t(n_rows), StepRows::kNotSampled);
  if (sampled) {
    for (size_t i = 0; i < sampling_->h_row_index.size(); ++i) {
      rows_.sampled[size_t(sampling_->h_row_index[i])] = sampling_->h_tokens[i];
    }
  }
  if (logprobs_) {
    const std::span<const int32_t> top_n = sampled ? std::span<const int32_t>(logprobs_->host_top_n()) : std::span<const int32_t>();
    hand_logprobs(rows_, size_t(n_rows), sampling_->h_row_index, top_n, logprobs_->host());
  }
  if (profile_) {
    const Clock::time_point t2 = Clock::now();
    auto ms = [](Clock::time_point a, Clock::time_point b) { return std::chrono::duration<double, std::milli>(b - a).count(); };
    if (prof_steps_ > 0) prof_gap_ms_ += ms(prof_last_end_, t0);
    prof_pack_ms_ += ms(t0, t1);
    prof_device_ms_ += ms(t1, t2);
    prof_tokens_ += batch_.n_tokens();
    prof_last_end_ = t2;
    if (++prof_steps_ % 256 == 0) {
      log::info("CUDA steps {}: per step {:.3f} ms engine host work between steps, {:.3f} ms packing, {:.3f} ms device "
                "step; {:.1f} tokens per step",
                prof_steps_, prof_gap_ms_ / 256, prof_pack_ms_ / 256, prof_device_ms_ / 256, double(prof_tokens_) / 256);
      prof_gap_ms_ = prof_pack_ms_ = prof_device_ms_ = 0;
      prof_tokens_ = 0;
    }
  }
  rows_.logits = logits_.data();
  return rows_;
}

std::vector<int64_t> CudaExecutor::block_tensor_bytes() const {
  const KvPoolLayout& l = decoder_->kv_pool().layout();
  std::vector<int64_t> bytes;
  for (int p : l.block_parts()) bytes.push_back(l.part_bytes(p));
  return bytes;
}

void CudaExecutor::save_state(int32_t slot, float* dst) {
  Status st = decoder_->save_state(slot, dst);
  if (!st.ok()) throw std::runtime_error("recurrent state copy to the host: " + st.error().to_string());
}

void CudaExecutor::load_state(int32_t slot, const float* src) {
  Status st = decoder_->load_state(slot, src);
  if (!st.ok()) throw std::runtime_error("recurrent state copy to the device: " + st.error().to_string());
}

void CudaExecutor::read_block(int32_t block, uint8_t* out) {
  Status st = decoder_->read_kv_block(block, out);
  if (!st.ok()) throw std::runtime_error("KV block copy to the host: " + st.error().to_string());
}

void CudaExecutor::write_block(int32_t block, const uint8_t* in) {
  Status st = decoder_->write_kv_block(block, in);
  if (!st.ok()) throw std::runtime_error("KV block copy to the device: " + st.error().to_string());
}

void CudaExecutor::read_window_blocks(std::span<const int32_t> blocks, uint8_t* out) {
  Status st = decoder_->read_window_kv_blocks(blocks, out);
  if (!st.ok()) throw std::runtime_error("window KV block copy to the host: " + st.error().to_string());
}

void CudaExecutor::write_window_blocks(std::span<const int32_t> blocks, const uint8_t* in) {
  Status st = decoder_->write_window_kv_blocks(blocks, in);
  if (!st.ok()) throw std::runtime_error("window KV block copy to the device: " + st.error().to_string());
}

void CudaExecutor::read_blocks(std::span<const int32_t> blocks, uint8_t* out) {
  if (!transfer_) return StepExecutor::read_blocks(blocks, out);
  Status st = transfer_->read(blocks, out);
  if (!st.ok()) throw std::runtime_error("KV blocks copy to the host: " + st.error().to_string());
}

void CudaExecutor::write_blocks(std::span<const int32_t> blocks, const uint8_t* in) {
  if (!transfer_) return StepExecutor::write_blocks(blocks, in);
  Status st = transfer_->write(blocks, in);
  if (!st.ok()) throw std::runtime_error("KV blocks copy to the device: " + st.error().to_string());
}

bool CudaExecutor::registered(const uint8_t* p, size_t bytes) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  for (const auto& [base, n] : registered_) {
    const uintptr_t b = reinterpret_cast<uintptr_t>(base);
    if (a >= b && a - b <= n && bytes <= n - (a - b)) return true;
  }
  return false;
}

void CudaExecutor::read_blocks_to(std::span<const int32_t> blocks, std::span<uint8_t* const> outs) {
  if (!transfer_) return StepExecutor::read_blocks_to(blocks, outs);
  const size_t bb = size_t(decoder_->kv_block_bytes());
  // Registered places take the direct copies; the others go through the staging, one call per
  // run of adjacent places (a staging buffer of many blocks: one call).
  std::vector<int32_t> direct_blocks;
  std::vector<uint8_t*> direct_outs;
  for (size_t i = 0; i < blocks.size();) {
    if (registered(outs[i], bb)) {
      direct_blocks.push_back(blocks[i]);
      direct_outs.push_back(outs[i]);
      ++i;
      continue;
    }
    size_t r = 1;
    while (i + r < blocks.size() && outs[i + r] == outs[i] + r * bb && !registered(outs[i + r], bb)) ++r;
    read_blocks(blocks.subspan(i, r), outs[i]);
    i += r;
  }
  if (direct_blocks.empty()) return;
  Status st = transfer_->read_direct(direct_blocks, direct_outs);
  if (!st.ok()) throw std::runtime_error("KV blocks copy to the host: " + st.error().to_string());
}

void CudaExecutor::write_blocks_from(std::span<const int32_t> blocks, std::span<const uint8_t* const> ins) {
  if (!transfer_) return StepExecutor::write_blocks_from(blocks, ins);
  const size_t bb = size_t(decoder_->kv_block_bytes());
  std::vector<int32_t> direct_blocks;
  std::vector<const uint8_t*> direct_ins;
  for (size_t i = 0; i < blocks.size();) {
    if (registered(ins[i], bb)) {
      direct_blocks.push_back(blocks[i]);
      direct_ins.push_back(ins[i]);
      ++i;
      continue;
    }
    size_t r = 1;
    while (i + r < blocks.size() && ins[i + r] == ins[i] + r * bb && !registered(ins[i + r], bb)) ++r;
    write_blocks(blocks.subspan(i, r), ins[i]);
    i += r;
  }
  if (direct_blocks.empty()) return;
  Status st = transfer_->write_direct(direct_blocks, direct_ins);
  if (!st.ok()) throw std::runtime_error("KV blocks copy to the device: " + st.error().to_string());
}

uint64_t CudaExecutor::read_blocks_to_async(std::span<const int32_t> blocks, std::span<uint8_t* const> outs) {
  return read_async(blocks, outs, true);
}

uint64_t CudaExecutor::read_held_blocks_to_async(std::span<const int32_t> blocks, std::span<uint8_t* const> outs) {
  return read_async(blocks, outs, false);
}

uint64_t CudaExecutor::read_async(std::span<const int32_t> blocks, std::span<uint8_t* const> outs, bool order_pool) {
  if (!transfer_) return StepExecutor::read_blocks_to_async(blocks, outs);
  const size_t bb = size_t(decoder_->kv_block_bytes());
  bool all_registered = true;
  for (uint8_t* p : outs) all_registered = all_registered && registered(p, bb);
  if (!all_registered) return StepExecutor::read_blocks_to_async(blocks, outs);
  auto r = transfer_->read_direct_async(blocks, outs, order_pool);
  if (!r.ok()) throw std::runtime_error("KV blocks copy to the host: " + r.error().to_string());
  return *r;
}

bool CudaExecutor::reads_landed(uint64_t ticket, bool wait) {
  if (!transfer_ || ticket == 0) return true;
  auto r = transfer_->reads_done(ticket, wait);
  if (!r.ok()) throw std::runtime_error("KV blocks copy to the host: " + r.error().to_string());
  return *r;
}

bool CudaExecutor::register_host_memory(void* p, size_t bytes) {
  if (p == nullptr || bytes == 0) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const cudaError_t e = cudaHostRegister(p, bytes, cudaHostRegisterDefault);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: later calls must not see it
    log::warn("KV host memory ({} bytes) not page-locked, its device copies are staged: {}", bytes, cudaGetErrorString(e));
    return false;
  }
  registered_.emplace_back(static_cast<const uint8_t*>(p), bytes);
  log::info("KV host memory page-locked for direct device copies: {} MiB in {:.0f} ms", bytes >> 20,
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  return true;
}

void CudaExecutor::unregister_host_memory(void* p) {
  for (auto it = registered_.begin(); it != registered_.end(); ++it) {
    if (it->first != p) continue;
    cudaHostUnregister(p);
    registered_.erase(it);
    return;
  }
}

KvCodecConfig cuda_kv_codecs(const KvCodecConfig& requested, bool f32_rows) {
  KvCodecConfig c = requested;
  if (f32_rows) return c;
  if (c.default_spec.codec == KvCodec::kAuto) c.default_spec.codec = KvCodec::kBf16;
  for (auto& l : c.layers) {
    if (l.spec.codec == KvCodec::kAuto) l.spec.codec = KvCodec::kBf16;
  }
  return c;
}

namespace {

// Per-layer specs of `codecs` (auto as bf16) for a model whose every layer owns its KV; empty
// when every layer is bf16 (the plain pool, whatever the family).
Result<std::vector<KvCodecSpec>> cuda_layer_codecs(const ModelConfig& cfg, const KvCodecConfig& codecs) {
  KvCodecConfig c = cuda_kv_codecs(codecs, false);
  const bool all_bf16 = c.default_spec.codec == KvCodec::kBf16 &&
                        std::all_of(c.layers.begin(), c.layers.end(), [](const KvLayerCodec& l) { return l.spec.codec == KvCodec::kBf16; });
  if (all_bf16) return std::vector<KvCodecSpec>{};
  c.quant_start = 0;
  std::vector<KvCodecLayerDims> dims(size_t(std::max(cfg.n_layers, 0)));
  for (auto& d : dims) {
    d.head_dim_k = cfg.head_dim;
    d.head_dim_v = cfg.head_dim;
  }
  if (is_hybrid_type(cfg.model_type)) {
    // Linear-attention layers keep no KV: --kv-config naming one is an error, as on the CPU.
    ModelConfig h = cfg;
    if (h.layer_types.empty() && h.text_json) STRATA_RETURN_IF_ERROR(resolve_hybrid_layer_types(&h));
    for (size_t l = 0; l < dims.size() && l < h.layer_types.size(); ++l) dims[l].has_kv = h.layer_types[l] != "linear_attention";
  }
  return resolve_kv_codecs(c, dims);
}

}  // namespace

int32_t cuda_window_pool_window(const ModelConfig& cfg) {
  if (cfg.sliding_window <= 0 || is_hybrid_type(cfg.model_type)) return 0;
  bool sliding = false, full = false;
  for (int l = 0; l < cfg.n_layers; ++l) (cfg.is_sliding(l) ? sliding : full) = true;
  return sliding && full ? cfg.sliding_window : 0;
}

bool cuda_device_present() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

Result<int32_t> cuda_kv_quant_start(const ModelConfig& cfg, const KvCodecConfig& codecs, int32_t block_size, bool kv_tiers) {
  if (codecs.quant_start == 0) return 0;
  const bool autos = codecs.quant_start == KvCodecConfig::kQuantStartAuto;
  if (codecs.quant_start < 0 && !autos) {
    return make_error(ErrorCode::kInvalidArgument, "--kv-quant-start must be >= 0, got " + std::to_string(codecs.quant_start));
  }
  const std::string flag = "--device cuda: --kv-quant-start " + std::to_string(codecs.quant_start);
  auto specs = cuda_layer_codecs(cfg, codecs);
  if (!specs.ok()) return specs.error();
  const bool quantized = std::any_of(specs->begin(), specs->end(), [](const KvCodecSpec& x) {
    return x.codec != KvCodec::kAuto && x.codec != KvCodec::kBf16;
  });
  if (!quantized) {
    if (autos) return 0;
    return make_error(ErrorCode::kInvalidArgument, flag + ": no layer has a codec to convert to (set --kv-cache-dtype or --kv-config)");
  }
  if (kv_tiers) {
    if (autos) return 0;
    return make_error(ErrorCode::kUnsupported, flag + " with the lower KV tiers is not supported; turn one of them off");
  }
  // auto stays 0 on sliding-window and recurrent-state models, as on the CPU (engine/engine.cpp):
  // an explicit start converts their full-attention layers only.
  if (autos) {
    if (is_hybrid_type(cfg.model_type)) return 0;
    for (int l = 0; l < cfg.n_layers; ++l) {
      if (cfg.is_sliding(l)) return 0;
    }
  }
  const std::vector<KvCodecSpec> exact(specs->size(), KvCodecSpec{KvCodec::kBf16, 0});
  if (const Status s = KvCodecStep::supported(cfg, exact, false, *specs); !s.ok()) {
    if (autos) return 0;
    return make_error(ErrorCode::kUnsupported, flag + ": " + s.error().message);
  }
  return autos ? block_size : codecs.quant_start;
}

Status check_cuda_engine_support(const ModelConfig& cfg, const KvCodecConfig& codecs) {
  auto refuse = [&](const std::string& what) {
    return make_error(ErrorCode::kUnsupported, "--device cuda: " + what);
  };
  auto family = family_flags(cfg);
  if (!family.ok()) return refuse(family.error().message + "; use --device cpu");
  auto specs = cuda_layer_codecs(cfg, codecs);
  if (!specs.ok()) return refuse(specs.error().message);
  if (codecs.quant_start > 0) {
    auto q = cuda_kv_quant_start(cfg, codecs, 1, false);
    if (!q.ok()) return q.error();
    return Status();
  }
  if (KvCodecStep::any_codec(*specs)) {
    const Status s = KvCodecStep::supported(cfg, *specs);
    if (!s.ok()) return refuse(s.error().message + "; use --kv-cache-dtype bf16 or --device cpu");
  }
  return Status();
}

Result<CudaEngineParts> make_cuda_engine_parts(const std::string& dir, const CudaEngineOptions& o) {
  if (!cuda_device_present()) return make_error(ErrorCode::kUnsupported, "--device cuda: no CUDA device is present");
  auto cfg = load_model_config(dir);
  if (!cfg.ok()) return cfg.error();
  STRATA_RETURN_IF_ERROR(check_cuda_engine_support(*cfg, o.kv_codecs));
  auto layer_codecs = cuda_layer_codecs(*cfg, o.kv_codecs);
  if (!layer_codecs.ok()) return layer_codecs.error();
  const bool codecs = KvCodecStep::any_codec(*layer_codecs);
  if (o.block_size < 1) return make_error(ErrorCode::kInvalidArgument, "block_size must be >= 1");
  const int32_t max_len = o.max_model_len > 0 ? o.max_model_len : cfg->max_position;
  if (max_len <= 0) return make_error(ErrorCode::kInvalidArgument, "--max-model-len must be set: the config gives no maximum position");
  CudaModelOptions mo;
  mo.block_size = o.block_size;
  mo.max_tokens = o.max_batch_tokens + step_token_slack(*cfg);
  mo.max_seqs = o.max_num_seqs;
  mo.deterministic = o.deterministic;
  mo.random_fp8 = o.random_weights && o.random_fp8;
  mo.max_blocks_per_seq = (max_len + o.block_size - 1) / o.block_size;
  // Sampled rows plus room for prompt-logprobs spans (their rows beyond this fail the step).
  mo.max_logit_rows = std::max(o.max_num_seqs, std::min(o.max_batch_tokens, 256));
  if (o.num_draft_tokens > 0) {
    mo.max_logit_rows = std::max<int32_t>(mo.max_logit_rows, std::min<int64_t>(o.max_batch_tokens, int64_t(o.max_num_seqs) * (o.num_draft_tokens + 1)));
  }
  auto quant_start = cuda_kv_quant_start(*cfg, o.kv_codecs, o.block_size, o.kv_tiers);
  if (!quant_start.ok()) return quant_start.error();
  if (*quant_start > 0) {
    // The pool keeps exact rows, a second one the codecs (CudaModelOptions::kv_quant_start).
    mo.kv_quant_start = *quant_start;
    mo.kv_quant_codecs = *layer_codecs;
  } else if (codecs) {
    mo.kv_codecs = *layer_codecs;
  }
  // bf16 asked for by name (default or any layer) keeps bf16 rows for f32 checkpoints too.
  mo.auto_kv_f32 = o.kv_codecs.default_spec.codec == KvCodec::kAuto &&
                   std::none_of(o.kv_codecs.layers.begin(), o.kv_codecs.layers.end(),
                                [](const KvLayerCodec& l) { return l.spec.codec == KvCodec::kBf16; });
  if (o.window_paging && cuda_window_pool_window(*cfg) > 0) {
    mo.kv_window_paging = true;  // the pool's split is the KV plan's (init_common)
    mo.kv_window_blocks = o.kv_window_blocks;
  }
  if (o.kv_cache_bytes > 0) {
    mo.kv_cache_bytes = o.kv_cache_bytes;
  } else {
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) return make_error(ErrorCode::kUnsupported, "cudaMemGetInfo failed");
    // What the process holds already (context) counts against the fraction; the cuBLASLt
    // handle and the pinned metadata take a little more, kept aside.
    // The KV block staging and the device sampling scratch (CudaExecutor) are taken after the
    // pool.
    const int64_t reserve = (int64_t(512) << 20) + KvTransfer::kDefaultStagingBytes +
                            int64_t(sampling_scratch_bytes(mo, cfg->vocab_size)) +
                            (codecs ? KvCodecStep::scratch_bytes(cfg->n_heads, cfg->n_kv_heads, cfg->head_dim, mo.max_tokens,
                                                                 mo.max_seqs, mo.kv_quant_start > 0)
                                    : 0);
    // f32/f16 checkpoints: the matrices' lo parts, the split's buffers and the f32 KV rows'
    // scratch (weight_split.h) come on top of the arena.
    int64_t split_bytes = 0;
    if (!o.random_weights) {
      auto archive = SafetensorsArchive::open_dir(dir);
      ModelConfig named = *cfg;
      if (archive.ok() && resolve_weight_names(&named, **archive).ok()) split_bytes = WeightSplit::extra_bytes(**archive, named, mo);
    }
    auto budget = device_kv_bytes(o.gpu_memory_fraction, int64_t(total_b), int64_t(free_b),
                                  CudaDecoder::arena_bytes_for(*cfg, mo) + split_bytes, reserve);
    if (!budget.ok()) return budget.error();
    mo.kv_cache_bytes = *budget;
  }
  Result<std::unique_ptr<CudaDecoder>> dec = o.random_weights ? CudaDecoder::random(*cfg, mo, o.seed, o.random_scale)
                                                              : CudaDecoder::load(dir, mo);
  if (!dec.ok()) {
    Error e = dec.error();
    e.message = "--device cuda: " + e.message;
    return e;
  }
  CudaEngineParts parts;
  parts.fp8_weights = (*dec)->fp8_weights();
  parts.kv_codecs = cuda_kv_codecs(o.kv_codecs, (*dec)->kv_f32_rows());
  parts.kv_codecs.quant_start = *quant_start;
  log::info("CUDA engine: {} weights {} MiB, {} KV blocks of {} tokens ({} MiB, KV {}){}{}{}", cfg->model_type,
            (*dec)->weight_bytes() >> 20, (*dec)->n_kv_blocks(), o.block_size,
            (int64_t((*dec)->n_kv_blocks()) * (*dec)->kv_block_bytes()) >> 20, codec_namespace(parts.kv_codecs),
            *quant_start > 0 ? ": exact blocks, and " + std::to_string((*dec)->n_kv_quant_blocks()) +
                                   " codec blocks the full ones move to past " + std::to_string(*quant_start) + " tokens"
                             : std::string(),
            (*dec)->n_kv_window_blocks() > 0
                ? ", sliding-window layers in " + std::to_string((*dec)->n_kv_window_blocks()) + " blocks of their own (" +
                      std::to_string((int64_t((*dec)->n_kv_window_blocks()) * (*dec)->kv_pool().layout().window_bytes_per_block()) >> 20) +
                      " MiB)"
                : std::string(),
            o.deterministic ? ", deterministic (batch-invariant) kernels" : "");
  parts.shape = std::make_unique<ShapeModel>(**dec);
  parts.executor = std::make_unique<CudaExecutor>(std::move(dec).value());
  return parts;
}

}  // namespace strata::cuda
