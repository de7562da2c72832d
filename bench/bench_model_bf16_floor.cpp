// Where a bf16 forward's error against the f32 reference goldens comes from, on the CPU forward
// (f32 arithmetic) with one rounding at a time switched on:
//   W   every f32 matrix of the checkpoint rounded to bf16 (what a bf16 upload keeps),
//   A   every GEMM input (the activations a linear layer reads) rounded to bf16,
//   KV  the KV cache stored in bf16 (the bf16 KV codec),
// and the combinations A+KV (what is left once the weights are exact) and W+A+KV (roughly the
// bf16 GPU forward; its attention's own bf16 operands aside). For every model of
// tests/data/reference/logits.json: the worst last_logits max-norm relative error over the
// cases and, teacher-forced on the oracle's greedy ids, the steps whose greedy token is outside
// the oracle's top-5 (the rule of tests/gpu/gpu_golden_test.cpp: error <= 2e-2, no step off).
// stories260k is compared with this forward's own f32 logits over its 256 greedy positions.
//
// The GEMM inputs are rounded by wrapping strata::cpu::matmul at link time (-Wl,--wrap, set in
// bench/CMakeLists.txt), so no engine code changes for the measurement.
// Usage: bench_model_bf16_floor [model ...]   (default: every golden model)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kv/codec/kv_codec_config.h"
#include "model/kv_storage.h"
#include "model/registry.h"
#include "tensor/dtype.h"

using namespace strata;

namespace {
bool g_round_inputs = false;
}  // namespace

// strata::cpu::matmul(ThreadPool&, const float*, int64_t, const WeightMatrix&, const float*, float*)
#define STRATA_MATMUL _ZN6strata3cpu6matmulERNS_10ThreadPoolEPKflRKNS_12WeightMatrixES4_Pf
#define STRATA_CAT2(a, b) a##b
#define STRATA_CAT(a, b) STRATA_CAT2(a, b)
extern "C" void STRATA_CAT(__real_, STRATA_MATMUL)(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w,
                                                  const float* bias, float* y);
extern "C" void STRATA_CAT(__wrap_, STRATA_MATMUL)(ThreadPool& pool, const float* x, int64_t m, const WeightMatrix& w,
                                                  const float* bias, float* y) {
  if (!g_round_inputs) {
    STRATA_CAT(__real_, STRATA_MATMUL)(pool, x, m, w, bias, y);
    return;
  }
  thread_local std::vector<float> rounded;
  const size_t n = size_t(m) * size_t(w.cols);
  rounded.resize(n);
  for (size_t i = 0; i < n; ++i) rounded[i] = bf16_to_f32(f32_to_bf16(x[i]));
  STRATA_CAT(__real_, STRATA_MATMUL)(pool, rounded.data(), m, w, bias, y);
}

namespace {

namespace fs = std::filesystem;

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_model_bf16_floor: %s\n", msg.c_str());
  std::exit(1);
}

std::string source_dir() { return STRATA_SOURCE_DIR; }

struct Case {
  std::vector<int32_t> prompt, greedy;
  std::vector<float> last_logits;
  std::vector<std::vector<int32_t>> top5;
};

double max_norm_rel(const float* got, const float* ref, int64_t n) {
  double err = 0.0, mag = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    err = std::max(err, std::fabs(double(got[i]) - double(ref[i])));
    mag = std::max(mag, std::fabs(double(ref[i])));
  }
  return mag > 0.0 ? err / mag : err;
}

std::vector<KvLayerSpec> layout_with(const Model& m, bool bf16_kv) {
  std::vector<KvLayerSpec> layout = m.kv_layout();
  if (!bf16_kv) return layout;
  std::vector<KvCodecLayerDims> dims;
  for (const auto& s : layout) dims.push_back({s.has_kv, s.shares_with, s.head_dim_k, s.head_dim_v});
  KvCodecConfig config;
  config.default_spec = {KvCodec::kBf16, 0};
  auto specs = resolve_kv_codecs(config, dims);
  if (!specs.ok()) die(specs.error().to_string());
  for (size_t l = 0; l < layout.size(); ++l) layout[l].codec = (*specs)[l];
  return layout;
}

// Copies dir's config files and its single model.safetensors with every F32 (or F16) tensor of
// rank >= 2 rounded to bf16 (kept in its dtype: the layout does not change). False when the
// checkpoint has no such tensor (a bf16 checkpoint) or is sharded.
bool write_rounded_copy(const fs::path& dir, const fs::path& out) {
  if (!fs::exists(dir / "model.safetensors")) return false;
  fs::create_directories(out);
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string n = e.path().filename().string();
    if (n != "model.safetensors" && e.is_regular_file()) fs::copy_file(e.path(), out / n, fs::copy_options::overwrite_existing);
  }
  std::ifstream in(dir / "model.safetensors", std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  const nlohmann::json header = nlohmann::json::parse(std::string(bytes.data() + 8, size_t(header_len)));
  char* data = bytes.data() + 8 + header_len;
  bool any = false;
  for (const auto& [name, t] : header.items()) {
    if (name == "__metadata__" || t["shape"].size() < 2) continue;
    const auto off = t["data_offsets"].get<std::vector<size_t>>();
    if (t["dtype"] == "F32") {
      for (size_t i = off[0]; i + 4 <= off[1]; i += 4) {
        float v;
        std::memcpy(&v, data + i, 4);
        v = bf16_to_f32(f32_to_bf16(v));
        std::memcpy(data + i, &v, 4);
      }
      any = true;
    } else if (t["dtype"] == "F16") {
      for (size_t i = off[0]; i + 2 <= off[1]; i += 2) {
        uint16_t h;
        std::memcpy(&h, data + i, 2);
        h = f32_to_f16(bf16_to_f32(f32_to_bf16(f16_to_f32(h))));
        std::memcpy(data + i, &h, 2);
      }
      any = true;
    }
  }
  std::ofstream(out / "model.safetensors", std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
  return any;
}

struct Score {
  double err = 0.0;
  int64_t off = 0, steps = 0;
};

// Teacher-forced over the oracle's cases: prefill the prompt, then one greedy id per step.
Score score_cases(Model& m, const std::vector<Case>& cases, bool bf16_kv) {
  const int32_t V = m.config().vocab_size;
  Score s;
  for (const Case& c : cases) {
    KvStorage kv(layout_with(m, bf16_kv), 16, 16);
    StepBatch batch;
    batch.tokens = c.prompt;
    SeqSpan span;
    for (int32_t b = 0; b < 16; ++b) span.block_table.push_back(b);
    span.n_tokens = int32_t(c.prompt.size());
    batch.seqs = {span};
    std::vector<float> logits(static_cast<size_t>(V));
    m.forward(batch, kv, nullptr, logits.data());
    s.err = std::max(s.err, max_norm_rel(logits.data(), c.last_logits.data(), V));
    for (size_t i = 0; i < c.greedy.size() && i < c.top5.size(); ++i) {
      const int32_t am = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
      ++s.steps;
      if (std::find(c.top5[i].begin(), c.top5[i].end(), am) == c.top5[i].end()) ++s.off;
      if (i + 1 == c.greedy.size()) break;
      batch.seqs[0].pos0 += batch.seqs[0].n_tokens;
      batch.seqs[0].n_tokens = 1;
      batch.tokens = {c.greedy[i]};
      m.forward(batch, kv, nullptr, logits.data());
    }
  }
  return s;
}

// stories260k: all positions of its greedy ids in one prefill, against `ref` (f32 logits).
std::vector<float> all_positions(Model& m, const std::vector<int32_t>& ids, bool bf16_kv) {
  const int32_t V = m.config().vocab_size, n = int32_t(ids.size());
  KvStorage kv(layout_with(m, bf16_kv), 32, 16);
  StepBatch batch;
  batch.tokens = ids;
  SeqSpan span;
  for (int32_t b = 0; b < 32; ++b) span.block_table.push_back(b);
  span.n_tokens = n;
  span.logits_all = true;
  batch.seqs = {span};
  std::vector<float> logits(size_t(n) * size_t(V));
  m.forward(batch, kv, nullptr, logits.data());
  return logits;
}

Score score_stories(Model& m, const std::vector<int32_t>& ids, const std::vector<float>& ref, bool bf16_kv) {
  const int32_t V = m.config().vocab_size;
  const std::vector<float> got = all_positions(m, ids, bf16_kv);
  Score s;
  const int64_t T = int64_t(ids.size());
  s.err = max_norm_rel(&got[size_t((T - 1) * V)], &ref[size_t((T - 1) * V)], V);
  for (int64_t t = 0; t < T; ++t) {
    const float* r = &ref[size_t(t * V)];
    std::vector<int32_t> idx(static_cast<size_t>(V));
    for (int32_t i = 0; i < V; ++i) idx[size_t(i)] = i;
    std::partial_sort(idx.begin(), idx.begin() + 5, idx.end(), [&](int32_t a, int32_t b) { return r[a] > r[b]; });
    const float* g = &got[size_t(t * V)];
    const int32_t am = int32_t(std::max_element(g, g + V) - g);
    ++s.steps;
    if (std::find(idx.begin(), idx.begin() + 5, am) == idx.begin() + 5) ++s.off;
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::ifstream in(source_dir() + "/tests/data/reference/logits.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(ss.str());
  struct Entry {
    std::string name, dir;
    bool softcap = true;
  };
  std::vector<Entry> models = {
      {"stories260k", "tests/data/reference/models/stories260k"},
      {"llama3-tiny", "tests/data/reference/models/llama3-tiny"},
      {"mistral-tiny", "tests/data/reference/models/mistral-tiny"},
      {"qwen2-tiny", "tests/data/reference/models/qwen2-tiny"},
      {"qwen3-tiny", "tests/data/reference/models/qwen3-tiny"},
      {"qwen3yarn-tiny", "tests/data/reference/models/qwen3yarn-tiny"},
      {"strata-demo", "models/strata-demo"},
      {"strata-demo-draft", "models/strata-demo-draft"},
      {"gemma2-tiny", "tests/data/reference/models/gemma2-tiny", false},
      {"gemma3-tiny", "tests/data/reference/models/gemma3-tiny"},
      {"gemma3mm-tiny", "tests/data/reference/models/gemma3mm-tiny"},
      {"qwen3moe-tiny", "tests/data/reference/models/qwen3moe-tiny"},
      {"gemma4-tiny", "tests/data/reference/models/gemma4-tiny"},
      {"gemma4moe-tiny", "tests/data/reference/models/gemma4moe-tiny"},
  };
  if (argc > 1) {
    std::vector<Entry> keep;
    for (int a = 1; a < argc; ++a) {
      for (const auto& e : models) {
        if (e.name == argv[a]) keep.push_back(e);
      }
    }
    models = keep;
  }
  ThreadPool pool(2);
  std::printf("CPU forward, last_logits max-norm rel error (worst case) / teacher-forced steps outside the top-5\n");
  std::printf("%-18s %-16s %-16s %-16s %-16s %-16s %-16s\n", "model", "f32", "W", "A", "KV", "A+KV", "W+A+KV");
  for (const auto& e : models) {
    const fs::path dir = fs::path(source_dir()) / e.dir;
    const fs::path copy = fs::temp_directory_path() / ("strata_bf16_floor_" + e.name);
    const bool has_rounded = write_rounded_copy(dir, copy);
    LoadOptions lo;
    lo.attn_softcap = e.softcap;
    auto exact = load_model(dir.string(), pool, lo);
    if (!exact.ok()) die(exact.error().to_string());
    std::unique_ptr<Model> rounded;
    if (has_rounded) {
      auto r = load_model(copy.string(), pool, lo);
      if (!r.ok()) die(r.error().to_string());
      rounded = std::move(*r);
    }
    const bool stories = e.name == "stories260k";
    std::vector<Case> cases;
    std::vector<int32_t> ids;
    std::vector<float> ref;
    if (stories) {
      ids = j[e.name]["greedy_from_bos_ids"].get<std::vector<int32_t>>();
      ids.pop_back();  // positions with a next oracle token
      ref = all_positions(**exact, ids, false);
    } else {
      for (const auto& c : j[e.name]["cases"]) {
        Case g;
        g.prompt = c["prompt_ids"].get<std::vector<int32_t>>();
        g.last_logits = c["last_logits"].get<std::vector<float>>();
        g.greedy = c["greedy_ids"].get<std::vector<int32_t>>();
        g.top5 = c["generated_top5"].get<std::vector<std::vector<int32_t>>>();
        cases.push_back(std::move(g));
      }
    }
    auto score = [&](Model& m, bool round_inputs, bool bf16_kv) {
      g_round_inputs = round_inputs;
      const Score s = stories ? score_stories(m, ids, ref, bf16_kv) : score_cases(m, cases, bf16_kv);
      g_round_inputs = false;
      char buf[64];
      std::snprintf(buf, sizeof(buf), "%.4f/%lld", s.err, static_cast<long long>(s.off));
      return std::string(buf);
    };
    const std::string f32 = score(**exact, false, false);
    const std::string w = rounded ? score(*rounded, false, false) : "-";
    const std::string a = score(**exact, true, false);
    const std::string kv = score(**exact, false, true);
    const std::string akv = score(**exact, true, true);
    const std::string wakv = rounded ? score(*rounded, true, true) : score(**exact, true, true);
    std::printf("%-18s %-16s %-16s %-16s %-16s %-16s %-16s\n", e.name.c_str(), f32.c_str(), w.c_str(), a.c_str(), kv.c_str(),
                akv.c_str(), wakv.c_str());
    std::fflush(stdout);
    fs::remove_all(copy);
  }
  std::printf("W: bf16-rounded matrices ('-': the checkpoint is bf16 already); A: GEMM inputs rounded to bf16; KV: bf16 KV "
              "cache. stories260k: against this forward in f32 over its 256 greedy positions.\n");
  return 0;
}
