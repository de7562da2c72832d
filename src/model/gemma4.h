// Gemma 4 text family (model_type gemma4_text; Gemma4ForCausalLM), dense and with the MoE
// block. The forward pass is described at the top of gemma4.cpp.
#pragma once

#include <memory>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "model/weight_loader.h"

namespace strata {

// The registry's loader for gemma4_text (see families.h for the contract).
Result<std::unique_ptr<Model>> load_gemma4_text(const ModelConfig& cfg, const WeightLoader& weights, ThreadPool& pool);

}  // namespace strata
