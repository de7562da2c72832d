// The device sampler's logprobs (SamplingBatch::chosen_logprob, top_ids, top_logprob) for the
// engine: device buffers for one step's sampled rows, their copy back to the host next to the
// tokens (a float and kSamplingMaxTopLogprobs pairs per row, instead of the row's logits), and
// the hand-over into StepRows by logit row.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "backend/cuda/sampling.h"
#include "runtime/step_executor.h"
#include "sampling/sampling_params.h"

namespace strata::cuda {

static_assert(kSamplingMaxTopLogprobs == kMaxTopLogprobs, "StepRows holds the device sampler's top lists as they are");

// The fields of a device sampler row that come from a request's SamplingParams (everything but
// the draw, the list ranges and top_logprobs, which the caller sets).
SamplingRow sampling_row(const SamplingParams& params);

// Host side of one step's values, indexed by sampled row (the sampler's batch row).
struct LogprobsHost {
  float* chosen = nullptr;  // [max_rows]
  int32_t* ids = nullptr;   // [max_rows, kSamplingMaxTopLogprobs]
  float* top = nullptr;     // [max_rows, kSamplingMaxTopLogprobs]
  static size_t bytes(int32_t max_rows) { return size_t(max_rows) * (4 + 8 * size_t(kSamplingMaxTopLogprobs)); }
  // Places the three arrays in `bytes(max_rows)` bytes at p (4-aligned).
  static LogprobsHost at(void* p, int32_t max_rows);
};

class DeviceLogprobs {
 public:
  // Null when the device buffers cannot be taken (the caller then leaves logprobs to the host).
  static std::unique_ptr<DeviceLogprobs> create(int32_t max_rows);
  ~DeviceLogprobs();
  DeviceLogprobs(const DeviceLogprobs&) = delete;
  DeviceLogprobs& operator=(const DeviceLogprobs&) = delete;

  // Points sampler batch b, whose first row is sampled row `first`, at the step's outputs
  // (written for its rows with top_logprobs >= 0).
  void attach(SamplingBatch& b, int32_t first) const;
  // Records each sampled row's top_logprobs into top_n and, when a row asks for logprobs,
  // queues the copy of the rows' values into dst on `stream` (dst pinned: asynchronous). top_n
  // is left empty when no row asks. Throws std::runtime_error when the copy cannot be queued.
  void copy_out(std::span<const SamplingRow> rows, const LogprobsHost& dst, std::vector<int32_t>& top_n,
                cudaStream_t stream) const;

  // The run() path's host copy (pageable, read after the step's synchronize).
  LogprobsHost host() { return LogprobsHost{h_chosen_.data(), h_ids_.data(), h_top_.data()}; }
  std::vector<int32_t>& host_top_n() { return h_top_n_; }

 private:
  DeviceLogprobs() = default;
  int32_t max_rows_ = 0;
  void* device_ = nullptr;  // LogprobsHost::bytes(max_rows_) on the device, laid out as `at`
  LogprobsHost d_;
  std::vector<float> h_chosen_, h_top_;
  std::vector<int32_t> h_ids_, h_top_n_;
};

// Resets rows' logprobs fields for a step of n_rows logit rows and hands sampled row k's values
// (src at k, where top_n[k] >= 0) to logit row logit_row[k]. With top_n empty the fields stay
// empty (no row has device logprobs).
void hand_logprobs(StepRows& rows, size_t n_rows, std::span<const int32_t> logit_row, std::span<const int32_t> top_n,
                   const LogprobsHost& src);

}  // namespace strata::cuda
