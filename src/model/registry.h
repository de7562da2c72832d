// The family registry: model_type -> loader. load_model reads DIR/config.json (and
// generation_config.json), maps the checkpoint, resolves where the text weights live and
// dispatches on the (unwrapped) model_type.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/thread_pool.h"
#include "model/families.h"
#include "model/model.h"
#include "model/safetensors.h"

namespace strata {

struct DecoderSpec;
using DecoderSpecFn = Result<DecoderSpec> (*)(const ModelConfig& cfg);

struct ModelFamily {
  const char* model_type;  // text model_type as config.json spells it
  ModelLoadFn load;
  // The family's DecoderSpec (model/decoder.h) when its layer is the shared decoder's; null for
  // families with a layer of their own (Gemma 4, the DeltaNet hybrids).
  DecoderSpecFn decoder_spec = nullptr;
};

// Every registered family, in registration order.
const std::vector<ModelFamily>& model_families();
// Their model_type strings (the accepted values of config.json's model_type, or of a
// wrapper's text_config.model_type).
std::vector<std::string> supported_model_types();

// The registered family of `model_type`, or null.
const ModelFamily* find_model_family(const std::string& model_type);
// The DecoderSpec of cfg's family: kUnsupported naming the model_type when the family is not
// a DecoderSpec family (or not registered), else the family's own errors.
Result<DecoderSpec> family_decoder_spec(const ModelConfig& cfg);

// Sets cfg->weight_prefix (where embed_tokens.weight lives: "model.", "model.language_model.",
// "language_model.model.", ...) and cfg->lm_head_name (empty when tied).
Status resolve_weight_names(ModelConfig* cfg, const SafetensorsArchive& archive);

struct LoadOptions {
  // Apply attn_logit_softcapping (Gemma 2) as the architecture defines it. transformers 5's
  // default SDPA attention silently drops this cap, and the reference goldens were computed
  // that way; false reproduces that behaviour.
  bool attn_softcap = true;
  // Load as a pooling model: forward's rows are final hidden states (ModelConfig::hidden_output).
  bool hidden_output = false;
  // Keep a quantized checkpoint's weights quantized in memory, dequantized inside the matmul
  // kernels (false: dequantize every weight to f32 at load).
  bool quantized_in_memory = true;
};

// Loads a Hugging Face model directory.
Result<std::unique_ptr<Model>> load_model(const std::string& dir, ThreadPool& pool, const LoadOptions& options = {});

}  // namespace strata
