// KV codec accuracy: mean and max KL divergence of the next-token distribution with the cache
// stored in each codec against the exact f32 cache, teacher-forced over a fixed text.
//   models/strata-demo (head dim 64): the first 2,048 tokens of the repository's LICENSE,
//     README.md and models/README.md, tokenized with the model's own tokenizer;
//   stories260k (head dim 8): its golden greedy ids from logits.json continued greedily with
//     the exact cache to its 512-token context.
// Each run is one packed forward with logits at every position; every codec stores every layer.
// Prints codec, bytes per token per layer (K and V, all KV heads), mean KL, max KL (nats), and
// the ratio of mean KL to the 1e-3 target that fp8 and int8 chase.
// Usage: bench_kv_accuracy [--threads N] [--tokens 2048]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "kv/codec/kv_codec_config.h"
#include "model/registry.h"
#include "model/single_sequence.h"
#include "tokenizer/tokenizer.h"

using namespace strata;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

[[noreturn]] void die(const std::string& msg) {
  std::fprintf(stderr, "bench_kv_accuracy: %s\n", msg.c_str());
  std::exit(1);
}

// Logits [ids.size(), vocab] of one prefill with every layer stored in `spec`.
std::vector<float> run(Model& m, const std::vector<int32_t>& ids, const KvCodecSpec& spec) {
  std::vector<KvLayerSpec> layout = m.kv_layout();
  std::vector<KvCodecLayerDims> dims;
  for (const auto& s : layout) dims.push_back({s.has_kv, s.shares_with, s.head_dim_k, s.head_dim_v});
  KvCodecConfig config;
  config.default_spec = spec;
  auto specs = resolve_kv_codecs(config, dims);
  if (!specs.ok()) die(specs.error().to_string());
  for (size_t l = 0; l < layout.size(); ++l) layout[l].codec = (*specs)[l];
  const int32_t bs = 16, n = int32_t(ids.size());
  KvStorage kv(layout, (n + bs - 1) / bs, bs);
  StepBatch batch;
  batch.tokens = ids;
  SeqSpan s;
  s.n_tokens = n;
  s.pos0 = 0;
  for (int32_t b = 0; b < (n + bs - 1) / bs; ++b) s.block_table.push_back(b);
  s.logits_all = true;
  batch.seqs = {s};
  std::vector<float> logits(size_t(n) * size_t(m.config().vocab_size));
  m.forward(batch, kv, nullptr, logits.data());
  return logits;
}

// log-softmax of one row, in double.
void log_softmax(const float* x, int64_t n, std::vector<double>* out) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(x[i]));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(x[i]) - mx);
  const double lse = mx + std::log(sum);
  out->resize(size_t(n));
  for (int64_t i = 0; i < n; ++i) (*out)[size_t(i)] = double(x[i]) - lse;
}

void table(Model& m, const std::string& name, const std::vector<int32_t>& ids) {
  const int64_t V = m.config().vocab_size, n = int64_t(ids.size());
  const auto t0 = bench::Clock::now();
  const std::vector<float> exact = run(m, ids, {KvCodec::kAuto, 0});
  std::printf("\n%s: %lld tokens teacher-forced, vocab %lld (exact f32 run %.2f s)\n", name.c_str(),
              static_cast<long long>(n), static_cast<long long>(V), bench::seconds_since(t0));
  std::printf("%-6s %14s %12s %12s %14s\n", "codec", "bytes/tok/layer", "mean KL", "max KL", "mean/1e-3");
  const KvLayerSpec l0 = m.kv_layout()[0];
  std::vector<double> p, q;
  for (KvCodec c : {KvCodec::kAuto, KvCodec::kBf16, KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo}) {
    const std::vector<float> got = c == KvCodec::kAuto ? exact : run(m, ids, {c, 0});
    double sum = 0.0, mx = 0.0;
    for (int64_t t = 0; t < n; ++t) {
      log_softmax(exact.data() + t * V, V, &p);
      log_softmax(got.data() + t * V, V, &q);
      double kl = 0.0;
      for (int64_t i = 0; i < V; ++i) kl += std::exp(p[size_t(i)]) * (p[size_t(i)] - q[size_t(i)]);
      sum += kl;
      mx = std::max(mx, kl);
    }
    KvLayerSpec spec = l0;
    spec.codec = {c, kv_default_group(c, l0.head_dim_k)};
    const double mean = sum / double(n);
    std::printf("%-6s %14lld %12.3e %12.3e %14.3f\n", kv_codec_name(c),
                static_cast<long long>(KvStorage::layer_bytes_per_token(spec)), mean, mx, mean / 1e-3);
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, n_tokens = 2048;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--tokens") n_tokens = std::atoi(next().c_str());
    else die("unknown argument " + a);
  }
  ThreadPool pool(threads);
  const std::string root = STRATA_SOURCE_DIR;

  {
    const std::string dir = root + "/models/strata-demo";
    auto tok = tokenizer::Tokenizer::load(dir);
    if (!tok.ok()) die(tok.error().to_string());
    const std::string text = read_file(root + "/LICENSE") + "\n" + read_file(root + "/README.md") + "\n" +
                             read_file(root + "/models/README.md");
    auto ids = tok->encode(text, false);
    if (!ids.ok()) die(ids.error().to_string());
    if (int64_t(ids->size()) < n_tokens) die("the text has only " + std::to_string(ids->size()) + " tokens");
    ids->resize(size_t(n_tokens));
    auto model = load_model(dir, pool);
    if (!model.ok()) die(model.error().to_string());
    table(**model, "strata-demo", *ids);
  }
  {
    const std::string dir = root + "/tests/data/reference/models/stories260k";
    const auto golden = nlohmann::json::parse(read_file(root + "/tests/data/reference/logits.json"));
    std::vector<int32_t> ids = golden["stories260k"]["greedy_from_bos_ids"].get<std::vector<int32_t>>();
    auto model = load_model(dir, pool);
    if (!model.ok()) die(model.error().to_string());
    Model& m = **model;
    const int32_t ctx = 512;
    SingleSequence seq(m, ctx);
    auto l = seq.prefill(ids, false);
    if (!l.ok()) die(l.error().to_string());
    while (int32_t(ids.size()) < ctx) {
      ids.push_back(argmax(l->data(), m.config().vocab_size));
      if (int32_t(ids.size()) == ctx) break;
      l = seq.step(ids.back());
      if (!l.ok()) die(l.error().to_string());
    }
    table(m, "stories260k", ids);
  }
  return 0;
}
