#include "model/synthetic_checkpoint.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <vector>

#include <nlohmann/json.hpp>

namespace strata {

namespace {

struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  bool ones = false;  // norm weights start at 1 (0 for (1 + w) norms is not needed here)
};

int64_t numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<TensorPlan> plan_tensors(const SyntheticModelSpec& s) {
  const int64_t H = s.hidden, D = s.head_dim, I = s.intermediate;
  std::vector<TensorPlan> t;
  t.push_back({"model.embed_tokens.weight", {s.vocab_size, H}});
  for (int l = 0; l < s.n_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    t.push_back({p + "input_layernorm.weight", {H}, true});
    t.push_back({p + "self_attn.q_proj.weight", {s.n_heads * D, H}});
    t.push_back({p + "self_attn.k_proj.weight", {s.n_kv_heads * D, H}});
    t.push_back({p + "self_attn.v_proj.weight", {s.n_kv_heads * D, H}});
    t.push_back({p + "self_attn.o_proj.weight", {H, s.n_heads * D}});
    if (s.model_type == "qwen3") {
      t.push_back({p + "self_attn.q_norm.weight", {D}, true});
      t.push_back({p + "self_attn.k_norm.weight", {D}, true});
    }
    t.push_back({p + "post_attention_layernorm.weight", {H}, true});
    t.push_back({p + "mlp.gate_proj.weight", {I, H}});
    t.push_back({p + "mlp.up_proj.weight", {I, H}});
    t.push_back({p + "mlp.down_proj.weight", {H, I}});
  }
  t.push_back({"model.norm.weight", {H}, true});
  if (!s.tie_embeddings) t.push_back({"lm_head.weight", {s.vocab_size, H}});
  return t;
}

// splitmix64: a fixed, portable generator so every machine writes the same weights.
uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Approximately normal: the sum of four uniforms, rescaled to unit variance.
float normalish(uint64_t& state) {
  float sum = 0.0f;
  for (int i = 0; i < 4; ++i) sum += float(splitmix(state) >> 40) * (1.0f / 16777216.0f);
  return (sum - 2.0f) * 1.7320508f;  // var of one uniform = 1/12; of four = 1/3
}

}  // namespace

SyntheticModelSpec qwen3_0_6b_spec() { return SyntheticModelSpec{}; }

int64_t synthetic_param_count(const SyntheticModelSpec& spec) {
  int64_t n = 0;
  for (const auto& t : plan_tensors(spec)) n += numel(t.shape);
  return n;
}

Status write_synthetic_checkpoint(const std::string& dir, const SyntheticModelSpec& s) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return make_error(ErrorCode::kIo, "cannot create directory " + dir + ": " + ec.message());
  if (s.dtype != DType::kBF16 && s.dtype != DType::kF32)
    return make_error(ErrorCode::kInvalidArgument, std::string("synthetic dtype must be bf16 or f32, got ") + dtype_name(s.dtype));

  nlohmann::json config = {
      {"architectures", {s.model_type == "qwen3" ? "Qwen3ForCausalLM" : "LlamaForCausalLM"}},
      {"model_type", s.model_type},
      {"vocab_size", s.vocab_size},
      {"hidden_size", s.hidden},
      {"num_hidden_layers", s.n_layers},
      {"num_attention_heads", s.n_heads},
      {"num_key_value_heads", s.n_kv_heads},
      {"head_dim", s.head_dim},
      {"intermediate_size", s.intermediate},
      {"max_position_embeddings", s.max_position},
      {"rms_norm_eps", 1e-6},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"tie_word_embeddings", s.tie_embeddings},
      {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", s.rope_theta}}},
      {"bos_token_id", s.bos_id},
      {"eos_token_id", s.eos_id},
      {"dtype", s.dtype == DType::kBF16 ? "bfloat16" : "float32"},
  };
  std::ofstream(dir + "/config.json") << config.dump(2) << "\n";
  nlohmann::json gen = {{"bos_token_id", s.bos_id}, {"eos_token_id", s.eos_id}};
  std::ofstream(dir + "/generation_config.json") << gen.dump(2) << "\n";

  const auto tensors = plan_tensors(s);
  const size_t elem = s.dtype == DType::kBF16 ? 2 : 4;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  header["__metadata__"] = {{"format", "pt"}};
  size_t offset = 0;
  for (const auto& t : tensors) {
    const size_t bytes = size_t(numel(t.shape)) * elem;
    header[t.name] = {{"dtype", s.dtype == DType::kBF16 ? "BF16" : "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string hjson = header.dump();
  while (hjson.size() % 8 != 0) hjson.push_back(' ');

  const std::string path = dir + "/model.safetensors";
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return make_error(ErrorCode::kIo, "cannot write " + path);
  const uint64_t hlen = hjson.size();
  bool ok = std::fwrite(&hlen, 8, 1, f) == 1 && std::fwrite(hjson.data(), 1, hjson.size(), f) == hjson.size();
  uint64_t rng = s.seed;
  std::vector<uint8_t> buf;
  for (const auto& t : tensors) {
    if (!ok) break;
    const int64_t n = numel(t.shape);
    constexpr int64_t kChunk = 1 << 20;
    for (int64_t done = 0; done < n && ok; done += kChunk) {
      const int64_t m = std::min<int64_t>(kChunk, n - done);
      buf.resize(size_t(m) * elem);
      for (int64_t i = 0; i < m; ++i) {
        const float v = t.ones ? 1.0f : normalish(rng) * s.init_std;
        if (elem == 2) {
          const bf16_t h = f32_to_bf16(v);
          std::memcpy(buf.data() + 2 * i, &h, 2);
        } else {
          std::memcpy(buf.data() + 4 * i, &v, 4);
        }
      }
      ok = std::fwrite(buf.data(), 1, buf.size(), f) == buf.size();
    }
  }
  if (std::fclose(f) != 0) ok = false;
  if (!ok) return make_error(ErrorCode::kIo, "short write to " + path);
  return Status();
}

}  // namespace strata
