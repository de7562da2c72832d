// The oracle's golden cases (tests/data/reference/logits.json) for the GPU tests, and
// checkpoint copies holding the weights the GPU uploads.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "runtime/cuda/cuda_model.h"

namespace strata::gpu_test {

// Decoder options sized for the oracle's tiny references: a 64 MiB KV pool of 16-token blocks,
// steps of up to 512 tokens over 8 sequences of up to 512 positions, 8 logit rows.
inline cuda::CudaModelOptions small_decoder_options() {
  cuda::CudaModelOptions o;
  o.kv_cache_bytes = int64_t(64) << 20;
  o.block_size = 16;
  o.max_tokens = 512;
  o.max_seqs = 8;
  o.max_blocks_per_seq = 32;
  o.max_logit_rows = 8;
  return o;
}

struct Case {
  std::vector<int32_t> prompt;
  std::vector<float> last_logits;
  std::vector<int32_t> greedy;
  std::vector<std::vector<int32_t>> top5;  // the oracle's top-5 at each greedy step
};

// logits.json, parsed once.
inline const nlohmann::json& logits_json() {
  static const nlohmann::json j = [] {
    std::ifstream in(source_dir() + "/tests/data/reference/logits.json");
    std::stringstream ss;
    ss << in.rdbuf();
    return nlohmann::json::parse(ss.str());
  }();
  return j;
}

// The cases of one model (empty when the oracle has none).
inline std::vector<Case> cases_for(const std::string& model) {
  std::vector<Case> out;
  const auto& j = logits_json();
  if (!j.contains(model) || !j[model].contains("cases")) return out;
  for (const auto& c : j[model]["cases"]) {
    Case g;
    g.prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    g.last_logits = c["last_logits"].get<std::vector<float>>();
    g.greedy = c["greedy_ids"].get<std::vector<int32_t>>();
    g.top5 = c["generated_top5"].get<std::vector<std::vector<int32_t>>>();
    out.push_back(std::move(g));
  }
  return out;
}

// Copies dir's config files and its model.safetensors with every F32 matrix rounded to bf16
// (kept F32, so the file layout does not change) into out: what CudaDecoder uploads as bf16,
// for a CPU forward over the GPU's weights. Vectors (norm weights, scales) and the
// gated-DeltaNet conv1d weights ([channels, 1, kernel], a vector per channel) stay f32, as on
// the GPU.
inline void write_bf16_rounded_copy(const std::filesystem::path& dir, const std::filesystem::path& out) {
  std::filesystem::create_directories(out);
  for (const char* f : {"config.json", "generation_config.json"}) {
    if (std::filesystem::exists(dir / f)) std::filesystem::copy_file(dir / f, out / f, std::filesystem::copy_options::overwrite_existing);
  }
  std::ifstream in(dir / "model.safetensors", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(std::string(bytes.data() + 8, size_t(header_len)));
  char* data = bytes.data() + 8 + header_len;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__" || t["dtype"] != "F32" || t["shape"].size() < 2) continue;
    if (name.find("conv1d") != std::string::npos) continue;
    const auto off = t["data_offsets"].get<std::vector<size_t>>();
    for (size_t i = off[0]; i + 4 <= off[1]; i += 4) {
      float v;
      std::memcpy(&v, data + i, 4);
      v = bf16_to_f32(f32_to_bf16(v));
      std::memcpy(data + i, &v, 4);
    }
  }
  std::ofstream(out / "model.safetensors", std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace strata::gpu_test
