// Speculative decoding on the CPU: strata-demo with strata-demo-draft (and n-gram lookup)
// against plain decoding, greedy, at batch 1 (requests one after another) and batch 8 (eight
// at once), adaptive k and a fixed k. Prints generated tokens per second (best of --reps
// interleaved runs: the host is shared), the speedup over plain decoding, the acceptance
// (accepted / drafted), tokens per verify (the speedup's limit with free drafts and verifies)
// and whether every output equals plain decoding's.
//
//   build/bench/bench_speculative [--tokens N] [--threads T] [--k K] [--reps R]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/log.h"
#include "core/thread_pool.h"
#include "engine/engine.h"
#include "model/registry.h"
#include "tokenizer/tokenizer.h"

using namespace strata;

namespace {

const char* kPrompts[] = {
    "And the LORD spake unto Moses, saying,",
    "In the beginning God created the heaven and the earth.",
    "The Python tutorial: a list comprehension consists of brackets containing an expression",
    "Blessed are the meek: for they shall inherit the earth.",
    "def fibonacci(n):\n    \"\"\"Return the nth Fibonacci number.\"\"\"\n",
    "And it came to pass, when men began to multiply on the face of the earth,",
    "A fortune: You will be honored for contributing your time and skill to a worthy cause.",
    "The for statement in Python differs a bit from what you may be used to in C or Pascal.",
};

struct Run {
  double seconds = 0;
  int64_t tokens = 0, drafted = 0, accepted = 0, verifies = 0;
  std::map<std::string, std::vector<int32_t>> out;
};

std::string source_dir() {
  const char* env = std::getenv("STRATA_SOURCE_DIR");
  return env ? env : STRATA_SOURCE_DIR;
}

Run run(const std::string& method, bool adaptive, int batch, int32_t n_tokens, int32_t k, ThreadPool& pool,
        const std::vector<std::vector<int32_t>>& prompts) {
  const std::string models = source_dir() + "/models/";
  auto target = load_model(models + "strata-demo", pool);
  if (!target.ok()) {
    std::fprintf(stderr, "%s\n", target.error().to_string().c_str());
    std::exit(1);
  }
  EngineOptions o;
  o.model_identity = "bench";
  o.max_num_seqs = 8;
  o.speculative.method = method;
  o.speculative.num_draft_tokens = k;
  o.speculative.adaptive = adaptive;
  if (method == "draft") {
    auto d = load_model(models + "strata-demo-draft", pool);
    if (!d.ok()) {
      std::fprintf(stderr, "%s\n", d.error().to_string().c_str());
      std::exit(1);
    }
    o.speculative.draft_model_dir = "strata-demo-draft";
    o.speculative.draft_model = std::shared_ptr<Model>(std::move(d).value());
  }
  auto engine = Engine::create(std::move(target).value(), o);
  if (!engine.ok()) {
    std::fprintf(stderr, "%s\n", engine.error().to_string().c_str());
    std::exit(1);
  }
  (*engine)->start();
  Run r;
  const auto t0 = std::chrono::steady_clock::now();
  for (size_t first = 0; first < prompts.size(); first += size_t(batch)) {
    std::vector<std::shared_ptr<RequestStream>> streams;
    for (size_t i = first; i < std::min(prompts.size(), first + size_t(batch)); ++i) {
      GenerationRequest g;
      g.id = "p" + std::to_string(i);
      g.prompt = prompts[i];
      g.max_tokens = n_tokens;
      g.ignore_eos = true;
      g.sampling.temperature = 0.0f;
      auto s = (*engine)->submit(g);
      if (!s.ok()) {
        std::fprintf(stderr, "%s\n", s.error().to_string().c_str());
        std::exit(1);
      }
      streams.push_back(*s);
    }
    for (auto& s : streams) {
      auto& toks = r.out[s->id()];
      for (;;) {
        auto e = s->next(std::chrono::seconds(600));
        if (!e) std::exit(2);
        toks.insert(toks.end(), e->tokens.begin(), e->tokens.end());
        if (e->final) {
          r.drafted += e->usage.draft_tokens;
          r.accepted += e->usage.accepted_tokens;
          break;
        }
      }
      r.tokens += int64_t(toks.size());
    }
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.verifies = (*engine)->stats().spec_verifies;
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  int32_t n_tokens = 128, k = 4;
  int threads = 2, reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokens")) n_tokens = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--k")) k = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  log::set_level("warn");
  ThreadPool pool(threads);
  auto tok = tokenizer::Tokenizer::load(source_dir() + "/models/strata-demo");
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.error().to_string().c_str());
    return 1;
  }
  std::vector<std::vector<int32_t>> prompts;
  for (const char* p : kPrompts) prompts.push_back(tok->encode(p, true).value());
  std::printf("strata-demo, greedy, %zu prompts x %d tokens, --num-draft-tokens %d, %d threads, best of %d\n",
              prompts.size(), n_tokens, k, threads, reps);
  std::printf("%-6s %-14s %9s %8s %9s %9s %9s %10s %s\n", "batch", "method", "tok/s", "speedup", "drafted", "accepted",
              "accept", "tok/verify", "same output");
  struct Mode {
    const char* name;
    std::string method;
    bool adaptive;
  };
  const Mode modes[] = {{"off", "off", true}, {"ngram", "ngram", true}, {"ngram fixed k", "ngram", false},
                        {"draft", "draft", true}, {"draft fixed k", "draft", false}};
  for (int batch : {1, 8}) {
    std::vector<Run> best(std::size(modes));
    for (int rep = 0; rep < reps; ++rep) {
      for (size_t m = 0; m < std::size(modes); ++m) {
        Run r = run(modes[m].method, modes[m].adaptive, batch, n_tokens, k, pool, prompts);
        if (rep == 0 || r.seconds < best[m].seconds) best[m] = std::move(r);
      }
    }
    const double base = double(best[0].tokens) / best[0].seconds;
    for (size_t m = 0; m < std::size(modes); ++m) {
      const Run& r = best[m];
      const double speed = double(r.tokens) / r.seconds;
      if (m == 0) {
        std::printf("%-6d %-14s %9.1f %8.2f %9s %9s %9s %10s %s\n", batch, modes[m].name, speed, 1.0, "-", "-", "-", "-", "-");
        continue;
      }
      const double tpv = r.verifies > 0 ? 1.0 + double(r.accepted) / double(r.verifies) : 1.0;
      std::printf("%-6d %-14s %9.1f %8.2f %9lld %9lld %8.1f%% %10.2f %s\n", batch, modes[m].name, speed, speed / base,
                  (long long)r.drafted, (long long)r.accepted, r.drafted ? 100.0 * double(r.accepted) / double(r.drafted) : 0.0,
                  tpv, r.out == best[0].out ? "yes" : "NO");
    }
  }
  return 0;
}
