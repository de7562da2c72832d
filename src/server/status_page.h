// The page at / (a status panel and a minimal streaming chat, one HTML file with its script,
// compiled into the binary) and GET /status, the JSON it polls: the model, the device, the KV
// pool and tiers, requests running and queued, and the engine's cumulative TTFT and
// inter-token latency sums (the page shows recent values from the difference of two polls).
// The page is public and holds nothing; its calls send the API key typed into it.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/request.h"

namespace strata::server {

struct StatusInfo {
  std::string model;
  std::string device;       // "cpu", "cuda" ("" when unknown)
  int32_t max_model_len = 0;
  int32_t block_size = 0;   // tokens per KV block
  int64_t kv_bytes_per_token = 0;  // bytes
};

nlohmann::json status_json(const StatusInfo& info, const EngineStats& engine);

// The page's HTML (with its CSS and script inline).
const std::string& status_page_html();

}  // namespace strata::server
