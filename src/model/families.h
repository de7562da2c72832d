// Loader entry points of every architecture family, one per family file; registry.cpp maps
// model_type strings to them. A loader gets the parsed config (weight_prefix and lm_head_name
// already resolved from the checkpoint's tensor names), the checkpoint under that prefix, and
// the thread pool the model will run on.
#pragma once

#include <memory>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/weight_loader.h"

namespace strata {

using ModelLoadFn = Result<std::unique_ptr<Model>> (*)(const ModelConfig& cfg, const WeightLoader& weights,
                                                       ThreadPool& pool);

Result<std::unique_ptr<Model>> load_llama(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);      // llama, mistral
Result<std::unique_ptr<Model>> load_qwen2(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);
Result<std::unique_ptr<Model>> load_qwen3(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);
Result<std::unique_ptr<Model>> load_qwen3_moe(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);
Result<std::unique_ptr<Model>> load_gemma2(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);
Result<std::unique_ptr<Model>> load_gemma3(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);  // gemma3_text

}  // namespace strata
