// KV codec accuracy: mean and max KL divergence of the next-token distribution with the cache
// stored in each codec against the exact f32 cache, teacher-forced over a fixed text.
//   models/strata-demo (head dim 64): the first 2,048 tokens of the repository's LICENSE,
//     README.md and models/README.md, tokenized with the model's own tokenizer;
//   stories260k (head dim 8): its golden greedy ids from logits.json continued greedily with
//     the exact cache to its 512-token context.
// Every codec stores every layer. Prints codec, bytes per token per layer (K and V, all KV
// heads), mean and max KL (nats) as the engine runs by default (--kv-quant-start auto: full
// blocks in the codec, the block being written exact; teacher-forced in chunks that end at
// block boundaries, so every position reads what a decode step at it reads), the ratio of that
// mean to the 1e-3 target that fp8 and int8 chase, and the KL with every row coded at write
// (--kv-quant-start 0: one packed forward with logits at every position).
// Then each lossy codec's KL with only its keys or only its values coded (the other side f32),
// the relative squared error of the exact cache's own K and V rows under each codec, and the
// KL with --kv-quant-start N (exact KV until a sequence passes N tokens, then its full blocks
// converted): over every position and over the positions after N.
// Usage: bench_kv_accuracy [--threads N] [--tokens 2048] [--quant-start 512 (stories260k: a quarter)]
//                          [--codecs fp8,turbo (default: all)] [--models strata-demo,stories260k (default: both)]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "bench/bench_util.h"
#include "backend/reference/kv_codec.h"
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

std::vector<KvLayerSpec> layout_with(const Model& m, const KvCodecSpec& spec) {
  std::vector<KvLayerSpec> layout = m.kv_layout();
  std::vector<KvCodecLayerDims> dims;
  for (const auto& s : layout) dims.push_back({s.has_kv, s.shares_with, s.head_dim_k, s.head_dim_v});
  KvCodecConfig config;
  config.default_spec = spec;
  auto specs = resolve_kv_codecs(config, dims);
  if (!specs.ok()) die(specs.error().to_string());
  for (size_t l = 0; l < layout.size(); ++l) layout[l].codec = (*specs)[l];
  return layout;
}

constexpr int32_t kBlock = 16;

// Logits [ids.size(), vocab] of one prefill with every layer stored in `spec`. `keep`: the
// storage, for the row statistics.
std::vector<float> run(Model& m, const std::vector<int32_t>& ids, const KvCodecSpec& spec,
                       std::unique_ptr<KvStorage>* keep = nullptr) {
  const int32_t n = int32_t(ids.size()), n_blocks = (n + kBlock - 1) / kBlock;
  auto kv = std::make_unique<KvStorage>(layout_with(m, spec), n_blocks, kBlock);
  StepBatch batch;
  batch.tokens = ids;
  SeqSpan s;
  s.n_tokens = n;
  s.pos0 = 0;
  for (int32_t b = 0; b < n_blocks; ++b) s.block_table.push_back(b);
  s.logits_all = true;
  batch.seqs = {s};
  std::vector<float> logits(size_t(n) * size_t(m.config().vocab_size));
  m.forward(batch, *kv, nullptr, logits.data());
  if (keep) *keep = std::move(kv);
  return logits;
}

// As the engine runs --kv-quant-start N: exact KV until the sequence passes N tokens, then
// after every step its full blocks are converted to `spec` (block by block, layer by layer)
// and read from the codec storage. Teacher-forced: [0, N + 1) in one exact forward, then
// chunks ending at block boundaries (a decode step per token reads the same formats).
std::vector<float> run_quant_start(Model& m, const std::vector<int32_t>& ids, const KvCodecSpec& spec, int32_t n_start) {
  const int32_t n = int32_t(ids.size()), n_blocks = (n + kBlock - 1) / kBlock;
  const int64_t V = m.config().vocab_size;
  KvStorage exact(layout_with(m, {KvCodec::kAuto, 0}), n_blocks, kBlock);
  KvStorage quant(layout_with(m, spec), n_blocks, kBlock);
  exact.set_quant(&quant);
  std::vector<float> logits(size_t(n) * size_t(V));
  SeqSpan s;
  for (int32_t b = 0; b < n_blocks; ++b) s.block_table.push_back(b);  // logical block b: id b in either storage
  s.logits_all = true;
  int32_t pos = 0;
  while (pos < n) {
    const int32_t end = pos == 0 ? std::min(n, n_start + 1) : std::min(n, (pos / kBlock + 1) * kBlock);
    StepBatch batch;
    batch.tokens.assign(ids.begin() + pos, ids.begin() + end);
    s.pos0 = pos;
    s.n_tokens = end - pos;
    batch.seqs = {s};
    m.forward(batch, exact, nullptr, logits.data() + size_t(pos) * size_t(V));
    pos = end;
    if (pos > n_start) {
      for (int l = 0; l < int(m.kv_layout().size()); ++l) {
        const KvLayerSpec& ls = exact.spec(l);
        if (!ls.has_kv || ls.shares_with >= 0 || ls.window > 0) continue;
        for (int32_t b = s.n_quant_blocks; b < pos / kBlock; ++b) convert_kv_block(exact, l, b, quant, b);
      }
      s.n_quant_blocks = pos / kBlock;
    }
  }
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

// Mean and max KL(exact || got) over positions [from, n).
std::pair<double, double> kl_stats(const std::vector<float>& exact, const std::vector<float>& got, int64_t V,
                                   int64_t from = 0) {
  const int64_t n = int64_t(exact.size()) / V;
  std::vector<double> p, q;
  double sum = 0.0, mx = 0.0;
  for (int64_t t = from; t < n; ++t) {
    log_softmax(exact.data() + t * V, V, &p);
    log_softmax(got.data() + t * V, V, &q);
    double kl = 0.0;
    for (int64_t i = 0; i < V; ++i) kl += std::exp(p[size_t(i)]) * (p[size_t(i)] - q[size_t(i)]);
    sum += kl;
    mx = std::max(mx, kl);
  }
  return {sum / double(n - from), mx};
}

// Relative squared error sum |x - dec(enc(x))|^2 / sum |x|^2 of the exact cache's key and
// value rows under `spec` (the codec's error on this model's own rows, before attention).
std::pair<double, double> row_errors(KvStorage& exact, const std::vector<KvLayerSpec>& layout, int32_t n_tokens,
                                     const KvCodecSpec& spec) {
  double err[2] = {0, 0}, mag[2] = {0, 0};
  std::vector<uint8_t> row(8192);
  std::vector<float> y(1024);
  for (int l = 0; l < int(layout.size()); ++l) {
    const KvLayerSpec& ls = layout[size_t(l)];
    if (!ls.has_kv || ls.shares_with >= 0) continue;
    for (int side = 0; side < 2; ++side) {
      const int32_t dim = side == 0 ? ls.head_dim_k : ls.head_dim_v;
      const KvRowFormat f = side == 0 ? kv_key_format({spec.codec, kv_default_group(spec.codec, dim)}, dim)
                                      : kv_value_format({spec.codec, kv_default_group(spec.codec, dim)}, dim);
      const float* x = side == 0 ? exact.k_pool(l) : exact.v_pool(l);
      for (int64_t r = 0; r < int64_t(n_tokens) * ls.n_kv_heads; ++r) {
        const uint64_t seed = kv_rotation_seed(l, int32_t(r % ls.n_kv_heads));
        const float* xr = x + r * dim;
        reference::kv_encode_row(f, xr, row.data(), seed);
        reference::kv_decode_row(f, row.data(), y.data(), seed);
        for (int32_t d = 0; d < dim; ++d) {
          err[side] += std::pow(double(y[size_t(d)]) - xr[d], 2);
          mag[side] += double(xr[d]) * xr[d];
        }
      }
    }
  }
  return {err[0] / mag[0], err[1] / mag[1]};
}

// Comma-separated names; empty: every one.
bool listed(const std::string& list, const std::string& name) {
  if (list.empty()) return true;
  return ("," + list + ",").find("," + name + ",") != std::string::npos;
}

void table(Model& m, const std::string& name, const std::vector<int32_t>& ids, int32_t quant_start,
           const std::string& codecs) {
  const int64_t V = m.config().vocab_size, n = int64_t(ids.size());
  const auto t0 = bench::Clock::now();
  std::unique_ptr<KvStorage> exact_kv;
  const std::vector<float> exact = run(m, ids, {KvCodec::kAuto, 0}, &exact_kv);
  std::printf("\n%s: %lld tokens teacher-forced, vocab %lld (exact f32 run %.2f s)\n", name.c_str(),
              static_cast<long long>(n), static_cast<long long>(V), bench::seconds_since(t0));
  std::printf("default: --kv-quant-start auto (one block: full blocks in the codec, the block being written exact;\n"
              "         fp8/int8/int4/turbo only); at write: --kv-quant-start 0 (every row in the codec)\n");
  std::printf("%-16s %15s %11s %11s %10s %11s %11s %11s %11s\n", "codec", "bytes/tok/layer", "mean KL", "max KL",
              "mean/1e-3", "at write", "max", "K row err", "V row err");
  const std::vector<KvLayerSpec> layout = m.kv_layout();
  const KvLayerSpec l0 = layout[0];
  const KvCodec all[] = {KvCodec::kAuto, KvCodec::kBf16, KvCodec::kFp8, KvCodec::kInt8, KvCodec::kInt4, KvCodec::kTurbo};
  auto quantizes = [](KvCodec c) { return c != KvCodec::kAuto && c != KvCodec::kBf16; };
  for (KvCodec c : all) {
    if (c != KvCodec::kAuto && !listed(codecs, kv_codec_name(c))) continue;
    const std::vector<float> at_write = c == KvCodec::kAuto ? exact : run(m, ids, {c, 0});
    const auto [mean0, mx0] = kl_stats(exact, at_write, V);
    double mean = mean0, mx = mx0;
    if (quantizes(c)) std::tie(mean, mx) = kl_stats(exact, run_quant_start(m, ids, {c, 0}, kBlock), V);
    KvLayerSpec spec = l0;
    spec.codec = {c, kv_default_group(c, l0.head_dim_k)};
    const auto [rk, rv] = row_errors(*exact_kv, layout, int32_t(n), {c, 0});
    std::printf("%-16s %15lld %11.3e %11.3e %10.3f %11.3e %11.3e %11.3e %11.3e\n", kv_codec_name(c),
                static_cast<long long>(KvStorage::layer_bytes_per_token(spec)), mean, mx, mean / 1e-3, mean0, mx0, rk, rv);
  }
  // Each lossy codec's error split into its key and value parts (the other side exact f32).
  std::printf("split (other side f32): mean KL default, at write\n");
  for (KvCodec c : all) {
    if (!quantizes(c) || !listed(codecs, kv_codec_name(c))) continue;
    for (KvCodecPart part : {KvCodecPart::kKeysOnly, KvCodecPart::kValuesOnly}) {
      const KvCodecSpec spec{c, 0, part};
      const double def = kl_stats(exact, run_quant_start(m, ids, spec, kBlock), V).first;
      const double at_write = kl_stats(exact, run(m, ids, spec), V).first;
      std::printf("%-16s %15s %11.3e %11s %10.3f %11.3e\n", kv_codec_spec_name(spec).c_str(), "", def, "", def / 1e-3, at_write);
    }
  }
  if (quant_start > 0 && quant_start < n) {
    std::printf("--kv-quant-start %d (exact KV until the sequence passes it, then full blocks converted):\n",
                quant_start);
    for (KvCodec c : {KvCodec::kInt8, KvCodec::kInt4, KvCodec::kFp8, KvCodec::kTurbo}) {
      if (!listed(codecs, kv_codec_name(c))) continue;
      const std::vector<float> got = run_quant_start(m, ids, {c, 0}, quant_start);
      const auto [mean, mx] = kl_stats(exact, got, V);
      const auto [mean_after, mx_after] = kl_stats(exact, got, V, quant_start + 1);
      std::printf("%-16s all positions: mean KL %.3e max %.3e; positions > %d: mean KL %.3e\n", kv_codec_name(c), mean,
                  mx, quant_start, mean_after);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2, n_tokens = 2048, quant_start = 512;
  std::string codecs, models;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--threads") threads = std::atoi(next().c_str());
    else if (a == "--tokens") n_tokens = std::atoi(next().c_str());
    else if (a == "--quant-start") quant_start = std::atoi(next().c_str());
    else if (a == "--codecs") codecs = next();
    else if (a == "--models") models = next();
    else die("unknown argument " + a);
  }
  ThreadPool pool(threads);
  const std::string root = STRATA_SOURCE_DIR;

  if (listed(models, "strata-demo")) {
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
    table(**model, "strata-demo", *ids, quant_start, codecs);
  }
  if (listed(models, "stories260k")) {
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
    table(m, "stories260k", ids, quant_start / 4, codecs);
  }
  return 0;
}
