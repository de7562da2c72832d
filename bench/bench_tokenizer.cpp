// Tokenizer benchmark: single-thread encode throughput (MB/s, tokens/s) of each reference
// tokenizer over a deterministic multi-megabyte mixed text built here, and the load time of
// each tokenizer.json. The same text can be dumped (--dump-text) and the results written as
// JSON (--json) for bench/compare_tokenizers.py, which times Hugging Face `tokenizers` on
// the same paragraphs and checks the ids agree (FNV-1a hash of all ids).
//
//   bench_tokenizer [--tokenizers DIR] [--only qwen3,llama3] [--mb 4] [--runs 3]
//                   [--dump-text FILE] [--json FILE]
// DIR holds <name>/tokenizer.json (or tokenizer.json.xz, unpacked to a temporary dir) and
// <name>/tokenizer_config.json; default tests/data/reference/tokenizers.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <time.h>
#include <unistd.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/unicode.h"

namespace {

namespace fs = std::filesystem;
using strata::tokenizer::Tokenizer;

// A tiny deterministic generator (the same stream on every platform).
struct SplitMix {
  uint64_t state;
  uint64_t next() {
    uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  size_t pick(size_t n) { return static_cast<size_t>(next() % n); }
};

const char* const kWords[] = {
    "the", "of", "and", "to", "in", "is", "that", "for", "it", "as", "was", "with", "be", "by", "on", "not", "he",
    "this", "are", "or", "his", "from", "at", "which", "but", "have", "an", "had", "they", "you", "were", "their",
    "one", "all", "we", "can", "her", "has", "there", "been", "if", "more", "when", "will", "would", "who", "so",
    "tokenizer", "inference", "server", "attention", "gradient", "probability", "distribution", "Kubernetes",
    "JavaScript", "don't", "it's", "we'll", "they're", "I'm", "New York", "Wednesday", "approximately", "éclair",
    "naïve", "café", "Zürich", "São Paulo", "Привет", "мир", "данные", "Καλημέρα", "κόσμε", "שלום", "مرحبا",
    "नमस्ते", "こんにちは", "世界", "東京", "数据", "模型", "推理", "안녕하세요", "데이터", "สวัสดี", "🙂", "🚀", "👍🏽",
    "👨‍👩‍👧", "∑", "≤", "→", "½", "™"};
const char* const kCode[] = {
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n  sum += a[i] * b[i];\n}\n",
    "SELECT id, name FROM users WHERE created_at > '2024-01-01' ORDER BY id DESC;\n",
    "{\"model\": \"qwen3\", \"messages\": [{\"role\": \"user\", \"content\": \"Hi!\"}], \"max_tokens\": 128}\n",
    "    x = torch.randn(4, 8, dtype=torch.bfloat16)\n\t\ty = x @ w.T  # [4, 16]\n"};

std::string paragraph(SplitMix& rng) {
  std::string p;
  const size_t target = 400 + rng.pick(2600);
  while (p.size() < target) {
    const size_t kind = rng.pick(20);
    if (kind == 0) {
      p += kCode[rng.pick(std::size(kCode))];
    } else if (kind == 1) {
      p += std::to_string(rng.next() % 1000000) + "." + std::to_string(rng.pick(100));
    } else if (kind == 2) {
      p += "   ";
    } else {
      p += kWords[rng.pick(std::size(kWords))];
    }
    const size_t sep = rng.pick(12);
    p += sep == 0 ? ", " : sep == 1 ? ". " : sep == 2 ? "\n" : " ";
  }
  // "\n\n" only ever ends a paragraph, so a reader can split the text back into them.
  size_t at;
  while ((at = p.find("\n\n")) != std::string::npos) p.erase(at, 1);
  while (!p.empty() && p.back() == '\n') p.pop_back();
  return p;
}

// Paragraphs separated by "\n\n"; each paragraph keeps its separator so the concatenation
// is the dumped text and the Python script can split it the same way.
std::vector<std::string> build_paragraphs(size_t bytes) {
  SplitMix rng{42};
  std::vector<std::string> out;
  size_t total = 0;
  while (total < bytes) {
    out.push_back(paragraph(rng) + "\n\n");
    total += out.back().size();
  }
  return out;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// CPU time of this thread: unlike wall time, not inflated when other processes share the
// cores.
double thread_cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + ts.tv_nsec * 1e-9;
}

std::string resolve_dir(const fs::path& root, const std::string& name) {
  const fs::path dir = root / name;
  if (fs::exists(dir / "tokenizer.json")) return dir.string();
  if (!fs::exists(dir / "tokenizer.json.xz")) return std::string();
  const fs::path tmp = fs::temp_directory_path() / ("strata_bench_tok_" + std::to_string(getpid())) / name;
  fs::create_directories(tmp);
  const std::string cmd = "xz -dc '" + (dir / "tokenizer.json.xz").string() + "' > '" + (tmp / "tokenizer.json").string() + "'";
  if (std::system(cmd.c_str()) != 0) return std::string();
  if (fs::exists(dir / "tokenizer_config.json")) {
    fs::copy_file(dir / "tokenizer_config.json", tmp / "tokenizer_config.json", fs::copy_options::overwrite_existing);
  }
  return tmp.string();
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string root = "tests/data/reference/tokenizers";
  std::vector<std::string> names = {"qwen3", "llama3", "gemma3", "llama2", "deepseek_v3", "gptoss"};
  double mb = 4.0;
  int runs = 3;
  std::string dump_path, json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--tokenizers") {
      root = value();
    } else if (a == "--only") {
      names = split_list(value());
    } else if (a == "--mb") {
      mb = std::atof(value().c_str());
    } else if (a == "--runs") {
      runs = std::max(1, std::atoi(value().c_str()));
    } else if (a == "--dump-text") {
      dump_path = value();
    } else if (a == "--json") {
      json_path = value();
    } else {
      std::fprintf(stderr,
                   "usage: bench_tokenizer [--tokenizers DIR] [--only a,b] [--mb N] [--runs N] [--dump-text FILE] "
                   "[--json FILE]\n");
      return 2;
    }
  }

  const auto paragraphs = build_paragraphs(static_cast<size_t>(mb * 1024 * 1024));
  size_t total_bytes = 0;
  for (const auto& p : paragraphs) total_bytes += p.size();
  std::printf("text: %zu paragraphs, %.2f MB (seed 42)\n", paragraphs.size(), total_bytes / 1048576.0);
  if (!dump_path.empty()) {
    std::ofstream out(dump_path, std::ios::binary);
    for (const auto& p : paragraphs) out << p;
    if (!out) {
      std::fprintf(stderr, "cannot write %s\n", dump_path.c_str());
      return 1;
    }
    std::printf("text written to %s\n", dump_path.c_str());
  }

  std::string json = "{\"text_bytes\": " + std::to_string(total_bytes) + ", \"tokenizers\": {";
  bool first = true;
  std::printf("%-12s %7s %7s %8s %8s %12s %10s %18s\n", "tokenizer", "load_s", "load_cpu", "MB/s", "MB/s_cpu",
              "tokens/s", "tokens", "ids_fnv1a");
  for (const auto& name : names) {
    const std::string dir = resolve_dir(root, name);
    if (dir.empty()) {
      std::fprintf(stderr, "%s: no tokenizer.json under %s\n", name.c_str(), (fs::path(root) / name).c_str());
      return 1;
    }
    const auto t_load = std::chrono::steady_clock::now();
    const double c_load = thread_cpu_seconds();
    auto tok = Tokenizer::load(dir);
    const double load_s = seconds_since(t_load);
    const double load_cpu_s = thread_cpu_seconds() - c_load;
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), tok.error().to_string().c_str());
      return 1;
    }
    double best = 1e30, best_cpu = 1e30;
    size_t n_tokens = 0;
    uint64_t hash = 1469598103934665603ull;
    for (int r = 0; r < runs; ++r) {
      size_t count = 0;
      uint64_t h = 1469598103934665603ull;
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = thread_cpu_seconds();
      for (const auto& p : paragraphs) {
        auto ids = tok->encode(p, /*add_special=*/false);
        if (!ids.ok()) {
          std::fprintf(stderr, "%s: %s\n", name.c_str(), ids.error().to_string().c_str());
          return 1;
        }
        count += ids->size();
        for (int32_t id : *ids) {
          for (int b = 0; b < 4; ++b) {
            h ^= (static_cast<uint32_t>(id) >> (8 * b)) & 0xFF;
            h *= 1099511628211ull;
          }
        }
      }
      best_cpu = std::min(best_cpu, thread_cpu_seconds() - c0);
      best = std::min(best, seconds_since(t0));
      n_tokens = count;
      hash = h;
    }
    const double mbps = total_bytes / 1048576.0 / best;
    const double tps = n_tokens / best;
    const double mbps_cpu = total_bytes / 1048576.0 / best_cpu;
    std::printf("%-12s %7.3f %7.3f %8.2f %8.2f %12.0f %10zu %18llx\n", name.c_str(), load_s, load_cpu_s, mbps, mbps_cpu,
                tps, n_tokens, static_cast<unsigned long long>(hash));
    char entry[512];
    std::snprintf(entry, sizeof(entry),
                  "%s\"%s\": {\"load_s\": %.4f, \"load_cpu_s\": %.4f, \"encode_s\": %.4f, \"encode_cpu_s\": %.4f, "
                  "\"mb_per_s\": %.3f, \"mb_per_s_cpu\": %.3f, \"tokens_per_s\": %.0f, \"tokens\": %zu, "
                  "\"ids_fnv1a\": \"%llx\"}",
                  first ? "" : ", ", name.c_str(), load_s, load_cpu_s, best, best_cpu, mbps, mbps_cpu, tps, n_tokens,
                  static_cast<unsigned long long>(hash));
    json += entry;
    first = false;
  }
  json += "}}\n";
  if (!json_path.empty()) {
    std::ofstream out(json_path);
    out << json;
  }
  return 0;
}
