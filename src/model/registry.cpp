#include "model/registry.h"

#include "core/log.h"
#include "model/decoder.h"
#include "model/qwen3_next.h"
#include "model/gemma4.h"

namespace strata {

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> kFamilies = {
      {"llama", load_llama, llama_decoder_spec},
      {"mistral", load_llama, llama_decoder_spec},
      {"qwen2", load_qwen2, qwen2_decoder_spec},
      {"qwen3", load_qwen3, qwen3_decoder_spec},
      {"qwen3_moe", load_qwen3_moe, qwen3_moe_decoder_spec},
      {"gemma2", load_gemma2, gemma2_decoder_spec},
      {"gemma3_text", load_gemma3, gemma3_decoder_spec},
      {"qwen3_next", load_qwen3_next},
      {"qwen3_5_text", load_qwen3_5},
      {"qwen3_5_moe_text", load_qwen3_5_moe},
      {"gemma4_text", load_gemma4_text},
  };
  return kFamilies;
}

std::vector<std::string> supported_model_types() {
  std::vector<std::string> v;
  for (const auto& f : model_families()) v.emplace_back(f.model_type);
  return v;
}

const ModelFamily* find_model_family(const std::string& model_type) {
  for (const auto& f : model_families()) {
    if (model_type == f.model_type) return &f;
  }
  return nullptr;
}

Result<DecoderSpec> family_decoder_spec(const ModelConfig& cfg) {
  const ModelFamily* f = find_model_family(cfg.model_type);
  if (f != nullptr && f->decoder_spec != nullptr) return f->decoder_spec(cfg);
  return make_error(ErrorCode::kUnsupported, "model_type '" + cfg.model_type + "' is not a decoder-spec family");
}

Status resolve_weight_names(ModelConfig* cfg, const SafetensorsArchive& archive) {
  static const char* kPrefixes[] = {"model.", "model.language_model.", "language_model.model.", "language_model.", ""};
  bool found = false;
  for (const char* p : kPrefixes) {
    if (archive.has(std::string(p) + "embed_tokens.weight")) {
      cfg->weight_prefix = p;
      found = true;
      break;
    }
  }
  if (!found) {
    return make_error(ErrorCode::kNotFound, "tensor 'model.embed_tokens.weight' (or a wrapper's language-model equivalent) "
                                            "is missing from the checkpoint");
  }
  cfg->lm_head_name.clear();
  if (cfg->tie_embeddings) return Status();
  for (const char* name : {"lm_head.weight", "language_model.lm_head.weight", "model.language_model.lm_head.weight"}) {
    if (archive.has(name)) {
      cfg->lm_head_name = name;
      return Status();
    }
  }
  return make_error(ErrorCode::kNotFound, "tensor 'lm_head.weight' is missing from the checkpoint (tie_word_embeddings is false)");
}

Result<std::unique_ptr<Model>> load_model(const std::string& dir, ThreadPool& pool, const LoadOptions& options) {
  auto cfg = load_model_config(dir);
  if (!cfg.ok()) return cfg.error();
  const ModelFamily* family = nullptr;
  for (const auto& f : model_families()) {
    if (cfg->model_type == f.model_type) family = &f;
  }
  if (family == nullptr) {
    std::string list;
    for (const auto& t : supported_model_types()) list += (list.empty() ? "" : ", ") + t;
    return make_error(ErrorCode::kUnsupported, dir + "/config.json: model_type '" + cfg->model_type +
                                                   "' is not supported (supported: " + list + ")");
  }
  auto archive = SafetensorsArchive::open_dir(dir);
  if (!archive.ok()) return archive.error();
  STRATA_RETURN_IF_ERROR(resolve_weight_names(&*cfg, **archive));
  if (!options.attn_softcap) cfg->attn_softcap = 0.0f;
  cfg->hidden_output = options.hidden_output;
  WeightLoader weights(*archive, cfg->weight_prefix, cfg->quant, options.quantized_in_memory);
  log::debug("loading {} ({} layers, hidden {}) from {}", cfg->model_type, cfg->n_layers, cfg->hidden, dir);
  return family->load(*cfg, weights, pool);
}

}  // namespace strata
