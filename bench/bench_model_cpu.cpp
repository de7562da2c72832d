// CPU model benchmark: decode and prefill of a Qwen3-0.6B-shaped model with random bf16
// weights the bench writes itself (or, with --dir, that checkpoint converted to a quantized
// format), against limits measured in the same run:
//   decode (batch 1): tokens/s over the bandwidth ceiling = measured memory bandwidth / bytes
//     read per token (every weight once as the CPU holds it + the KV cache so far);
//   prefill: linear-layer FLOP rate over cblas_sgemm's rate on the same shapes, same threads.
// Usage: bench_model_cpu [--dir DIR] [--threads N] [--prompt 512] [--decode 64] [--quick]
#include <cblas.h>

#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>

#include "bench/bench_util.h"
#include "model/quant.h"
#include "model/registry.h"
#include "model/safetensors.h"
#include "model/single_sequence.h"
#include "model/synthetic_checkpoint.h"

using namespace strata;
using namespace strata::bench;

namespace {

struct LinearShape {
  const char* name;
  int64_t n, k;  // W [n, k]
};

}  // namespace

int main(int argc, char** argv) {
  std::string dir = "/tmp/strata-bench-qwen3-0.6b";
  int threads = 0, n_prompt = 512, n_decode = 64;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--dir") dir = next();
    else if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--prompt") n_prompt = std::atoi(next().c_str());
    else if (a == "--decode") n_decode = std::atoi(next().c_str());
    else if (a == "--quick") quick = true;
    else {
      std::fprintf(stderr, "unknown argument %s\n", a.c_str());
      return 2;
    }
  }
  ThreadPool pool(threads);
  blas_set_threads(pool.size());
  const SyntheticModelSpec spec = qwen3_0_6b_spec();

  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    std::printf("writing %s (%.2fB parameters, bf16)...\n", dir.c_str(), synthetic_param_count(spec) / 1e9);
    const auto t0 = Clock::now();
    Status st = write_synthetic_checkpoint(dir, spec);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.error().to_string().c_str());
      return 1;
    }
    std::printf("  written in %.1f s\n", seconds_since(t0));
  }
  const auto t_load = Clock::now();
  auto model = load_model(dir, pool);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.error().to_string().c_str());
    return 1;
  }
  std::printf("model: qwen3 0.6B shape, %d layers, hidden %d, vocab %d, loaded in %.2f s, %d threads, BLAS core %s\n",
              spec.n_layers, spec.hidden, spec.vocab_size, seconds_since(t_load), pool.size(), blas_core_name());
  const ModelConfig& cfg = (*model)->config();
  if (cfg.n_layers != spec.n_layers || cfg.hidden != spec.hidden || cfg.vocab_size != spec.vocab_size) {
    std::fprintf(stderr, "%s is not the qwen3 0.6B shape\n", dir.c_str());
    return 1;
  }
  auto archive = SafetensorsArchive::open_dir(dir);
  if (!archive.ok()) {
    std::fprintf(stderr, "%s\n", archive.error().to_string().c_str());
    return 1;
  }
  // Every weight once as the CPU model holds it (quantized codes and scales, bf16, f32 vectors).
  const WeightBytesPerToken wb = weight_bytes_per_token(cfg, **archive);
  std::printf("weights: %s; %.1f MB a token reads as the CPU holds them (%.1f MB as stored)\n",
              cfg.quant ? cfg.quant->describe().c_str() : "none", wb.resident / 1e6, wb.stored / 1e6);

  // (1) The machine's memory bandwidth.
  const Bandwidth bw = measure_bandwidth(pool, size_t(quick ? 512 : 2048) << 20, 3);
  std::printf("memory bandwidth: streaming read %.1f GB/s, memcpy %.1f GB/s (read+written)\n", bw.read_gbs, bw.copy_gbs);

  // (2) Prefill and decode.
  SingleSequence seq(**model, n_prompt + n_decode + 16);
  std::mt19937 rng(7);
  std::vector<int32_t> prompt(static_cast<size_t>(n_prompt));
  for (auto& t : prompt) t = int32_t(rng() % uint32_t(spec.vocab_size));

  double t_prefill = 1e30;
  std::vector<float> logits;
  for (int rep = 0; rep < (quick ? 1 : 2); ++rep) {
    seq.reset();
    const auto t0 = Clock::now();
    auto r = seq.prefill(prompt);
    t_prefill = std::min(t_prefill, seconds_since(t0));
    if (!r.ok()) {
      std::fprintf(stderr, "%s\n", r.error().to_string().c_str());
      return 1;
    }
    logits = std::move(*r);
  }
  int32_t tok = argmax(logits.data(), spec.vocab_size);
  (void)seq.step(tok);  // warm the decode path
  const auto t0 = Clock::now();
  for (int i = 0; i < n_decode; ++i) {
    auto r = seq.step(tok);
    tok = argmax(r->data(), spec.vocab_size);
  }
  const double t_decode = seconds_since(t0) / n_decode;

  // Bytes a decode step must read: every weight once and the KV cache (f32) so far.
  const int64_t H = spec.hidden, D = spec.head_dim, I = spec.intermediate;
  const int64_t weight_bytes = wb.resident;
  const int64_t ctx_mid = n_prompt + n_decode / 2;
  const int64_t kv_bytes = ctx_mid * spec.n_layers * spec.n_kv_heads * D * 2 * 4;
  const double bytes_per_token = double(weight_bytes + kv_bytes);
  // The ceiling uses the larger of the two probes (streaming read, memcpy read+written): on a
  // shared VM either can come out low, and a higher ceiling only lowers the reported ratio.
  const double bw_gbs = std::max(bw.read_gbs, bw.copy_gbs);
  const double ceiling_tps = bw_gbs * 1e9 / bytes_per_token;
  const double decode_tps = 1.0 / t_decode;
  std::printf("\ndecode, batch 1, context %d..%d: %.2f tok/s (%.1f ms/token)\n", n_prompt, n_prompt + n_decode,
              decode_tps, t_decode * 1e3);
  std::printf("  bytes read per token %.1f MB -> ceiling %.2f tok/s at %.1f GB/s; ratio to ceiling %.2f\n",
              bytes_per_token / 1e6, ceiling_tps, bw_gbs, decode_tps / ceiling_tps);
  const double read_ceiling_tps = bw.read_gbs * 1e9 / bytes_per_token;
  std::printf("  against the streaming-read probe alone (%.1f GB/s): ceiling %.2f tok/s; ratio %.2f\n", bw.read_gbs,
              read_ceiling_tps, decode_tps / read_ceiling_tps);

  // sgemm on the same linear shapes (m = prompt tokens), same thread count.
  const LinearShape shapes[] = {{"q", spec.n_heads * D, H}, {"k", spec.n_kv_heads * D, H}, {"v", spec.n_kv_heads * D, H},
                                {"o", H, spec.n_heads * D}, {"gate", I, H},                 {"up", I, H},
                                {"down", H, I}};
  double sgemm_time = 0.0, linear_flops = 0.0;
  for (const auto& s : shapes) {
    std::vector<float> x(size_t(n_prompt * s.k), 0.01f), w(size_t(s.n * s.k), 0.02f), y(size_t(n_prompt * s.n));
    const double t = best_seconds(quick ? 2 : 3, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n_prompt, int(s.n), int(s.k), 1.0f, x.data(), int(s.k),
                  w.data(), int(s.k), 0.0f, y.data(), int(s.n));
    });
    sgemm_time += t * spec.n_layers;
    linear_flops += 2.0 * double(n_prompt) * double(s.n * s.k) * spec.n_layers;
  }
  linear_flops += 2.0 * double(spec.vocab_size) * double(H);  // lm head on the last token
  const double sgemm_rate = linear_flops / sgemm_time;
  const double prefill_rate = linear_flops / t_prefill;
  std::printf("\nprefill, %d tokens: %.3f s, %.1f tok/s\n", n_prompt, t_prefill, n_prompt / t_prefill);
  std::printf("  linear-layer FLOP rate %.1f GFLOP/s (attention and norms counted as overhead)\n", prefill_rate / 1e9);
  std::printf("  cblas_sgemm on the same shapes: %.1f GFLOP/s; ratio %.2f\n", sgemm_rate / 1e9, prefill_rate / sgemm_rate);
  return 0;
}
