// The roofline of a serving benchmark: the least time a device of the given copy bandwidth
// and GEMM rate needs for the workload's steps, each step costing (weight bytes + KV bytes
// read) / bandwidth + FLOPs / GEMM rate. Requests run in waves of `concurrency`; a wave
// prefills its prompts in steps of max_batch_tokens tokens, then decodes all its sequences
// together one token per step. Weights and KV count in bf16.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace strata::cli {

struct RooflineShape {
  int64_t n_layers = 0, hidden = 0, intermediate = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0, vocab = 0;
  bool tied = false;
  int64_t max_batch_tokens = 2048;  // tokens of one prefill step
  // Bytes of the matrices a step reads (every layer's projections and the LM head), bf16.
  int64_t weight_bytes() const;
  int64_t kv_bytes_per_token() const { return n_layers * 2 * n_kv_heads * head_dim * 2; }
};

// From a model directory's config.json.
Result<RooflineShape> roofline_shape_from_dir(const std::string& dir);
// From the "strata" object of a /v1/models card, when the server gives one.
std::optional<RooflineShape> roofline_shape_from_card(const nlohmann::json& card);

struct RooflineWorkload {
  int64_t n_requests = 0;
  int64_t concurrency = 1;
  double input_len = 0;   // mean prompt tokens
  double output_len = 0;  // mean generated tokens
};

struct Roofline {
  double seconds = 0;
  double weight_bytes = 0, kv_bytes = 0, flops = 0;  // summed over the steps
  int64_t steps = 0;
};

Roofline roofline(const RooflineShape& s, const RooflineWorkload& w, double bandwidth_bytes_s, double gemm_flops_s);

}  // namespace strata::cli
