// Grammar mask speed on the qwen3 vocabulary (151,936 ids), one core: compile time per schema,
// and the time of fill_next_token_bitmask per token while walking the qwen3 encoding of a real
// sample output of each schema (tests/data/grammar/sample_outputs.json). "cold": the first
// walk on a fresh token-mask cache, so states' masks are computed on first use; "warm": later
// walks reusing them (the server's case for a schema seen before). Ratio: p99 over the 1 ms
// per-token target. Memory: the token-mask cache after the walks, and with every state cached.
//
//   build/bench/bench_sampling_grammar [tokenizer.json.xz] [sample_outputs.json] [warm_walks]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sampling/grammar/grammar.h"

using namespace strata::grammar;
using Clock = std::chrono::steady_clock;

namespace {

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5));
  return v[i];
}

std::shared_ptr<const Vocabulary> load_qwen3(const std::string& xz_path) {
  FILE* p = popen(("xz -dc '" + xz_path + "'").c_str(), "r");
  std::string text;
  char buf[1 << 16];
  for (size_t n; p && (n = fread(buf, 1, sizeof buf, p)) > 0;) text.append(buf, n);
  if (p) pclose(p);
  if (text.empty()) return nullptr;
  const auto j = nlohmann::json::parse(text);
  std::vector<std::string> toks(151936);
  for (auto it = j["model"]["vocab"].begin(); it != j["model"]["vocab"].end(); ++it)
    toks[it.value().get<int32_t>()] = byte_level_piece_bytes(it.key());
  std::vector<int32_t> special, stop;
  for (const auto& t : j["added_tokens"]) {
    const int32_t id = t["id"].get<int32_t>();
    toks[id] = t["content"].get<std::string>();
    if (toks[id] == "<|endoftext|>" || toks[id] == "<|im_end|>") stop.push_back(id);
    else if (t["special"].get<bool>()) special.push_back(id);
  }
  auto v = Vocabulary::create(std::move(toks), special, stop);
  return v.ok() ? *v : nullptr;
}

// Per-token mask times (ms) of one walk; false if the sample is not accepted.
bool walk(const std::shared_ptr<const TokenMaskCache>& masks, const std::vector<int32_t>& ids, std::vector<double>& ms) {
  Matcher m(masks);
  std::vector<uint32_t> w(masks->vocab().mask_words());
  for (int32_t id : ids) {
    const auto t0 = Clock::now();
    m.fill_next_token_bitmask(w.data());
    ms.push_back(ms_since(t0));
    if (!((w[id >> 5] >> (id & 31)) & 1) || !m.accept_token(id)) return false;
  }
  const auto t0 = Clock::now();
  m.fill_next_token_bitmask(w.data());  // the mask that allows only the stop ids
  ms.push_back(ms_since(t0));
  return m.can_terminate();
}

}  // namespace

int main(int argc, char** argv) {
  const std::string tok = argc > 1 ? argv[1] : "tests/data/reference/tokenizers/qwen3/tokenizer.json.xz";
  const std::string samples_path = argc > 2 ? argv[2] : "tests/data/grammar/sample_outputs.json";
  const int warm_walks = argc > 3 ? std::atoi(argv[3]) : 20;
  const auto t_vocab = Clock::now();
  auto vocab = load_qwen3(tok);
  if (!vocab) {
    std::fprintf(stderr, "cannot load %s\n", tok.c_str());
    return 1;
  }
  const double vocab_ms = ms_since(t_vocab);
  std::ifstream in(samples_path);
  if (!in) {
    std::fprintf(stderr, "cannot read %s\n", samples_path.c_str());
    return 1;
  }
  const auto samples = nlohmann::ordered_json::parse(in);
  std::printf("qwen3 vocabulary: %d ids, %zu text tokens (loaded in %.0f ms); %d warm walks per schema\n\n",
              vocab->size(), vocab->sorted().size(), vocab_ms, warm_walks);
  std::printf("%-15s %6s %7s %9s | %8s %8s %8s | %8s %8s %8s | %9s %7s %7s %7s\n", "schema", "tokens", "states", "compile",
              "cold p50", "cold p99", "cold max", "warm p50", "warm p99", "warm max", "p99/1ms", "all ms", "walk MB", "all MB");
  std::vector<double> all_warm, all_cold;
  int failures = 0;
  for (const auto& s : samples) {
    const std::string name = s["name"].get<std::string>();
    const std::string schema = s["schema"].dump();
    const auto ids = s["qwen3_ids"].get<std::vector<int32_t>>();
    std::vector<double> compile_ms;
    std::shared_ptr<const Grammar> g;
    for (int r = 0; r < 5; ++r) {
      const auto t0 = Clock::now();
      auto c = compile_json_schema(schema, {});
      compile_ms.push_back(ms_since(t0));
      if (!c.ok()) {
        std::fprintf(stderr, "%s: %s\n", name.c_str(), c.error().message.c_str());
        return 1;
      }
      g = *c;
    }
    auto masks = std::make_shared<const TokenMaskCache>(g, vocab);
    std::vector<double> cold, warm;
    bool ok = walk(masks, ids, cold);
    for (int r = 0; r < warm_walks && ok; ++r) ok = walk(masks, ids, warm);
    if (!ok) {
      std::fprintf(stderr, "%s: the sample output was not accepted\n", name.c_str());
      ++failures;
    }
    // Every state's mask at once, on a fresh cache: the cost of precomputing at compile time.
    auto fresh = std::make_shared<const TokenMaskCache>(g, vocab);
    const auto t0 = Clock::now();
    fresh->precompute_all();
    const double all_ms = ms_since(t0);
    all_warm.insert(all_warm.end(), warm.begin(), warm.end());
    all_cold.insert(all_cold.end(), cold.begin(), cold.end());
    std::printf("%-15s %6zu %7d %7.2fms | %8.3f %8.3f %8.3f | %8.4f %8.4f %8.4f | %9.3f %7.0f %7.2f %7.2f\n", name.c_str(),
                ids.size(), fresh->n_cached(), pct(compile_ms, 0.5), pct(cold, 0.5), pct(cold, 0.99), pct(cold, 1.0),
                pct(warm, 0.5), pct(warm, 0.99), pct(warm, 1.0), pct(warm, 0.99) / 1.0, all_ms, masks->memory_bytes() / 1e6,
                fresh->memory_bytes() / 1e6);
  }
  std::printf("\nall schemas: warm p50 %.4f ms, p99 %.4f ms (%zu masks); cold p50 %.3f ms, p99 %.3f ms (%zu masks)\n",
              pct(all_warm, 0.5), pct(all_warm, 0.99), all_warm.size(), pct(all_cold, 0.5), pct(all_cold, 0.99),
              all_cold.size());
  std::printf("warm p99 / 1 ms target: %.3f\n", pct(all_warm, 0.99));
  return failures ? 1 : 0;
}
