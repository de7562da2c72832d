#include "model/lora.h"

#include <xxhash.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "backend/cpu/cpu_ops.h"
#include "model/safetensors.h"
#include "model/weight_loader.h"

namespace strata {

namespace fs = std::filesystem;
using nlohmann::json;

int lora_role_index(WeightRole role) {
  for (size_t i = 0; i < kLoraRoles.size(); ++i) {
    if (kLoraRoles[i] == role) return int(i);
  }
  return -1;
}

const LoraLinear* LoraAdapter::find(int32_t layer, WeightRole role) const {
  const int r = lora_role_index(role);
  if (layer < 0 || size_t(layer) >= layers.size() || r < 0) return nullptr;
  const LoraLinear& l = layers[size_t(layer)][size_t(r)];
  return l.empty() ? nullptr : &l;
}

namespace {

Error unsupported(const fs::path& p, const std::string& what) {
  return make_error(ErrorCode::kUnsupported, p.string() + ": " + what);
}
Error invalid(const fs::path& p, const std::string& what) {
  return make_error(ErrorCode::kInvalidArgument, p.string() + ": " + what);
}

// PEFT matches a rank_pattern / alpha_pattern key against a module's full name as a regex
// that must end at a name boundary.
bool pattern_matches(const std::string& key, const std::string& module) {
  try {
    return std::regex_match(module, std::regex("(.*\\.)?" + key));
  } catch (const std::regex_error&) {
    return module == key || module.ends_with("." + key);
  }
}

}  // namespace

Result<std::shared_ptr<const LoraAdapter>> load_lora_adapter(const std::string& dir, const ModelConfig& cfg,
                                                             const WeightManifest& manifest, int32_t max_rank) {
  const fs::path cfg_path = fs::path(dir) / "adapter_config.json";
  std::ifstream in(cfg_path);
  if (!in) return make_error(ErrorCode::kNotFound, cfg_path.string() + ": cannot be opened (a PEFT adapter directory holds it)");
  const std::string cfg_text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const json c = json::parse(cfg_text, nullptr, false);
  if (c.is_discarded() || !c.is_object()) return invalid(cfg_path, "is not a JSON object");
  auto field = [&](const char* k) -> const json* { return c.contains(k) && !c[k].is_null() ? &c[k] : nullptr; };
  if (const json* t = field("peft_type"); t && *t != "LORA") return unsupported(cfg_path, "peft_type " + t->dump() + " (LORA only)");
  if (const json* d = field("use_dora"); d && d->is_boolean() && d->get<bool>()) return unsupported(cfg_path, "use_dora true (DoRA)");
  if (const json* m = field("modules_to_save"); m && !(m->is_array() && m->empty())) {
    return unsupported(cfg_path, "modules_to_save " + m->dump() + " (full copies of modules are not applied)");
  }
  if (const json* b = field("bias"); b && *b != "none") return unsupported(cfg_path, "bias " + b->dump() + " (only \"none\")");
  if (const json* f = field("fan_in_fan_out"); f && f->is_boolean() && f->get<bool>()) return unsupported(cfg_path, "fan_in_fan_out true");
  if (const json* l = field("layers_to_transform")) return unsupported(cfg_path, "layers_to_transform " + l->dump());
  if (const json* l = field("lora_bias"); l && l->is_boolean() && l->get<bool>()) return unsupported(cfg_path, "lora_bias true");
  const json* r_json = field("r");
  if (!r_json || !r_json->is_number_integer() || r_json->get<int64_t>() < 1) return invalid(cfg_path, "field 'r' must be a positive integer");
  const int32_t r_default = r_json->get<int32_t>();
  float alpha_default = float(r_default);
  if (const json* a = field("lora_alpha")) {
    if (!a->is_number()) return invalid(cfg_path, "field 'lora_alpha' must be a number, got " + a->dump());
    alpha_default = a->get<float>();
  }
  const bool rslora = field("use_rslora") && c["use_rslora"].is_boolean() && c["use_rslora"].get<bool>();
  std::map<std::string, int32_t> rank_pattern;
  std::map<std::string, float> alpha_pattern;
  if (const json* p = field("rank_pattern")) {
    if (!p->is_object()) return invalid(cfg_path, "field 'rank_pattern' must be an object");
    for (const auto& [k, v] : p->items()) {
      if (!v.is_number_integer() || v.get<int64_t>() < 1) return invalid(cfg_path, "rank_pattern '" + k + "' must be a positive integer");
      rank_pattern[k] = v.get<int32_t>();
    }
  }
  if (const json* p = field("alpha_pattern")) {
    if (!p->is_object()) return invalid(cfg_path, "field 'alpha_pattern' must be an object");
    for (const auto& [k, v] : p->items()) {
      if (!v.is_number()) return invalid(cfg_path, "alpha_pattern '" + k + "' must be a number");
      alpha_pattern[k] = v.get<float>();
    }
  }
  const fs::path st = fs::path(dir) / "adapter_model.safetensors";
  auto archive = SafetensorsArchive::open_file(st.string());
  if (!archive.ok()) return archive.error();

  auto out = std::make_shared<LoraAdapter>();
  out->dir = dir;
  out->layers.resize(size_t(cfg.n_layers));
  std::set<std::string> used;
  XXH3_state_t* h = XXH3_createState();
  XXH3_64bits_reset(h);
  XXH3_64bits_update(h, cfg_text.data(), cfg_text.size());
  for (const WeightEntry& e : manifest.entries) {
    const int ri = lora_role_index(e.role);
    if (ri < 0 || e.layer < 0 || e.expert >= 0 || !e.is_matrix()) continue;
    // The module the entry's weight belongs to, as PEFT names it: base_model.model.<prefix><module>.
    std::string module = (e.absolute ? std::string() : cfg.weight_prefix) + e.name;
    if (module.ends_with(".weight")) module.resize(module.size() - 7);
    const std::string a_name = "base_model.model." + module + ".lora_A.weight";
    const std::string b_name = "base_model.model." + module + ".lora_B.weight";
    const TensorInfo* a = (*archive)->find(a_name);
    const TensorInfo* b = (*archive)->find(b_name);
    if (a == nullptr && b == nullptr) continue;  // not a target
    if (a == nullptr || b == nullptr) return invalid(st, "module " + module + " has only one of lora_A and lora_B");
    int32_t rank = r_default;
    float alpha = alpha_default;
    for (const auto& [k, v] : rank_pattern) if (pattern_matches(k, module)) rank = v;
    for (const auto& [k, v] : alpha_pattern) if (pattern_matches(k, module)) alpha = v;
    const int64_t n_out = e.shape[0], n_in = e.shape[1];
    if (a->shape != std::vector<int64_t>{rank, n_in} || b->shape != std::vector<int64_t>{n_out, rank}) {
      return invalid(st, module + ": lora_A " + a->shape_string() + " and lora_B " + b->shape_string() + " do not fit rank " +
                             std::to_string(rank) + " on a [" + std::to_string(n_out) + ", " + std::to_string(n_in) + "] linear");
    }
    if (max_rank > 0 && rank > max_rank) {
      return make_error(ErrorCode::kInvalidArgument, st.string() + ": " + module + " has rank " + std::to_string(rank) +
                                                         ", above --max-lora-rank " + std::to_string(max_rank));
    }
    LoraLinear& l = out->layers[size_t(e.layer)][size_t(ri)];
    for (const TensorInfo* t : {a, b}) {
      std::vector<float> f(size_t(t->numel()));
      STRATA_RETURN_IF_ERROR(convert_to_f32(*t, t->data, t->numel(), f.data()));
      XXH3_64bits_update(h, t->name.data(), t->name.size());
      XXH3_64bits_update(h, f.data(), f.size() * sizeof(float));
      (t == a ? l.a : l.b) = cpu::pack_weight(DType::kF32, f.data(), t->shape[0], t->shape[1]);
    }
    l.scale = rslora ? alpha / std::sqrt(float(rank)) : alpha / float(rank);
    out->max_rank = std::max(out->max_rank, rank);
    used.insert(a_name);
    used.insert(b_name);
  }
  out->content_hash = XXH3_64bits_digest(h);
  XXH3_freeState(h);
  for (const std::string& name : (*archive)->names()) {
    if (!used.count(name)) {
      return unsupported(st, "tensor " + name + " targets no attention or dense MLP projection of this " + cfg.model_type +
                                 " model (experts, embeddings and other modules take no adapter yet)");
    }
  }
  if (used.empty()) return invalid(st, "holds no LoRA tensor for this model");
  return std::shared_ptr<const LoraAdapter>(std::move(out));
}

void lora_apply(ThreadPool& pool, const StepBatch& batch, const LoraSlots& slots, int32_t layer, WeightRole role,
                const float* x, int64_t n_in, float* y, int64_t n_out, std::vector<float>& scratch) {
  int64_t t0 = 0;
  for (const SeqSpan& s : batch.seqs) {
    const int64_t n = s.n_tokens;
    if (s.adapter >= 0 && size_t(s.adapter) < slots.size() && slots[size_t(s.adapter)] && n > 0) {
      if (const LoraLinear* l = slots[size_t(s.adapter)]->find(layer, role)) {
        const int64_t r = l->a.rows;
        scratch.resize(size_t(n * (r + n_out)));
        float* t = scratch.data();
        float* d = t + n * r;
        cpu::matmul(pool, x + t0 * n_in, n, l->a, nullptr, t);
        cpu::matmul(pool, t, n, l->b, nullptr, d);
        float* dst = y + t0 * n_out;
        for (int64_t i = 0; i < n * n_out; ++i) dst[i] += l->scale * d[i];
      }
    }
    t0 += n;
  }
}

}  // namespace strata
