#include "runtime/cuda/device_logprobs.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "core/check.h"

namespace strata::cuda {

LogprobsHost LogprobsHost::at(void* p, int32_t max_rows) {
  const size_t n = size_t(max_rows), t = size_t(kSamplingMaxTopLogprobs);
  LogprobsHost h;
  h.chosen = static_cast<float*>(p);
  h.ids = reinterpret_cast<int32_t*>(h.chosen + n);
  h.top = reinterpret_cast<float*>(h.ids + n * t);
  return h;
}

std::unique_ptr<DeviceLogprobs> DeviceLogprobs::create(int32_t max_rows) {
  std::unique_ptr<DeviceLogprobs> d(new DeviceLogprobs());
  d->max_rows_ = max_rows;
  if (max_rows <= 0 || cudaMalloc(&d->device_, LogprobsHost::bytes(max_rows)) != cudaSuccess) {
    cudaGetLastError();  // not sticky: later calls must not see it
    d->device_ = nullptr;
    return nullptr;
  }
  d->d_ = LogprobsHost::at(d->device_, max_rows);
  const size_t n = size_t(max_rows), t = size_t(kSamplingMaxTopLogprobs);
  d->h_chosen_.resize(n);
  d->h_ids_.resize(n * t);
  d->h_top_.resize(n * t);
  return d;
}

DeviceLogprobs::~DeviceLogprobs() {
  if (device_ != nullptr) cudaFree(device_);
}

void DeviceLogprobs::attach(SamplingBatch& b, int32_t first) const {
  b.chosen_logprob = d_.chosen + first;
  b.top_ids = d_.ids + int64_t(first) * kSamplingMaxTopLogprobs;
  b.top_logprob = d_.top + int64_t(first) * kSamplingMaxTopLogprobs;
}

void DeviceLogprobs::copy_out(std::span<const SamplingRow> rows, const LogprobsHost& dst, std::vector<int32_t>& top_n,
                              cudaStream_t stream) const {
  top_n.clear();
  const bool any = std::any_of(rows.begin(), rows.end(), [](const SamplingRow& r) { return r.top_logprobs >= 0; });
  if (!any) return;
  STRATA_CHECK(int64_t(rows.size()) <= max_rows_, "device logprobs: more sampled rows than the buffers hold");
  for (const SamplingRow& r : rows) top_n.push_back(r.top_logprobs);
  const size_t n = rows.size(), t = size_t(kSamplingMaxTopLogprobs);
  auto copy = [&](void* to, const void* from, size_t bytes) {
    const cudaError_t e = cudaMemcpyAsync(to, from, bytes, cudaMemcpyDeviceToHost, stream);
    if (e != cudaSuccess) throw std::runtime_error(std::string("device logprobs: copy failed: ") + cudaGetErrorString(e));
  };
  copy(dst.chosen, d_.chosen, n * 4);
  copy(dst.ids, d_.ids, n * t * 4);
  copy(dst.top, d_.top, n * t * 4);
}

void hand_logprobs(StepRows& rows, size_t n_rows, std::span<const int32_t> logit_row, std::span<const int32_t> top_n,
                   const LogprobsHost& src) {
  rows.top_n.clear();
  if (top_n.empty()) return;
  STRATA_CHECK(top_n.size() == logit_row.size(), "device logprobs: one top_n per sampled row");
  const size_t t = size_t(kMaxTopLogprobs);
  rows.top_n.assign(n_rows, -1);
  rows.chosen_logprob.assign(n_rows, -INFINITY);
  rows.top_ids.assign(n_rows * t, -1);
  rows.top_logprobs.assign(n_rows * t, -INFINITY);
  for (size_t k = 0; k < top_n.size(); ++k) {
    if (top_n[k] < 0) continue;
    const size_t r = size_t(logit_row[k]);
    STRATA_CHECK(r < n_rows, "device logprobs: a sampled row past the step's rows");
    rows.top_n[r] = std::min(top_n[k], kMaxTopLogprobs);
    rows.chosen_logprob[r] = src.chosen[k];
    std::copy_n(src.ids + k * t, t, rows.top_ids.begin() + long(r * t));
    std::copy_n(src.top + k * t, t, rows.top_logprobs.begin() + long(r * t));
  }
}

SamplingRow sampling_row(const SamplingParams& params) {
  SamplingRow r;
  r.temperature = params.temperature;
  r.top_k = params.top_k;
  r.top_p = params.top_p;
  r.min_p = params.min_p;
  r.repetition_penalty = params.repetition_penalty;
  r.presence_penalty = params.presence_penalty;
  r.frequency_penalty = params.frequency_penalty;
  r.vocab_limit = params.vocab_limit;
  return r;
}

}  // namespace strata::cuda
