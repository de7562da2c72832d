// POST /v1/embeddings (OpenAI's shape): inputs as text or token ids, one or many; each runs its
// prompt through the engine as an embed request (batched with the others by the scheduler) and
// comes back last-token pooled, L2-normalized when the checkpoint's modules say so, truncated
// to `dimensions` (then re-normalized), as float lists or base64 little-endian f32.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/api_request.h"
#include "server/request_mapping.h"

namespace strata::server {

inline constexpr size_t kMaxEmbeddingInputs = 2048;  // inputs per request at most (OpenAI's cap)

struct EmbeddingsRequest {
  std::vector<std::vector<int32_t>> inputs;  // token ids per input, instruction prompt included
  bool base64 = false;                       // encoding_format "base64"
  int32_t dimensions = 0;                    // 0: the model's hidden size
  int32_t prompt_tokens = 0;                 // over every input
};

// Validates and tokenizes a body (model, input, encoding_format, dimensions, user, and the
// sentence-transformers extensions prompt_name / prompt: an instruction prefix for text input).
std::optional<ApiError> parse_embeddings_request(const nlohmann::json& body, const ServedModel& model,
                                                 const ParseLimits& limits, EmbeddingsRequest* out);

// One pooled vector from the model's final hidden row [hidden]: truncated to `dimensions`
// (0: all), then L2-normalized when `normalize` (a zero vector stays zero).
std::vector<float> pool_embedding(const std::vector<float>& hidden, int32_t dimensions, bool normalize);

// The response body for the vectors of r's inputs, in input order.
nlohmann::json embeddings_response(const EmbeddingsRequest& r, const std::vector<std::vector<float>>& vectors,
                                   const std::string& model_name);

// Runs a parsed request on the engine: submits every input, waits for all of them (cancelling
// the rest when client_gone() turns true or one fails), and returns the vectors in input order
// or the error. `id_prefix` makes the engine request ids (unique per call).
std::optional<ApiError> run_embeddings(Engine& engine, const ServedModel& model, const EmbeddingsRequest& r,
                                       const std::string& id_prefix, const std::function<bool()>& client_gone,
                                       std::vector<std::vector<float>>* vectors, Usage* usage);

}  // namespace strata::server
