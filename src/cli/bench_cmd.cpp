// strata bench: load generation against a running server.
//   strata bench serve       streaming /v1/completions requests with token-id prompts at a fixed
//                            concurrency or a Poisson request rate; metrics as vLLM's
//                            `bench serve` defines them: TTFT (send -> first streamed token),
//                            TPOT ((e2e - ttft) / (output_tokens - 1)), ITL (gaps between
//                            streamed chunks), E2EL; mean, median, p90, p99; request, output
//                            and total token throughput over the whole run.
//   strata bench synth-model writes a random-weight Hugging Face checkpoint (tests, benchmarks).
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/roofline.h"
#include "core/log.h"
#include "model/synthetic_checkpoint.h"

#ifdef STRATA_WITH_CUDA
#include "backend/cuda/device_peaks.h"
#endif

namespace strata::cli {

namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct BenchArgs {
  std::string url = "http://127.0.0.1:8080";
  std::string model;
  int num_prompts = 100;
  int concurrency = 0;         // 0: unbounded (with --request-rate) or 1
  double request_rate = 0.0;   // requests/s; 0: send as fast as concurrency allows
  int input_len = 1024;
  int output_len = 128;
  std::string dataset;
  bool ignore_eos = false;
  uint64_t seed = 0;
  std::string json_out;
  std::string api_key;
  double timeout_s = 600.0;
  double peak_bandwidth_gbs = 0.0;  // roofline: copy bandwidth (read + write); 0: measure or none
  double peak_tflops = 0.0;         // roofline: bf16 GEMM rate; 0: measure or none
  std::string model_config;         // roofline: a model directory (config.json) when the server gives no shape
  std::string extra_body;           // a JSON object merged into every request (e.g. a response_format)
  json extra;                       // extra_body parsed
};

struct Prompt {
  json prompt;  // token ids or text
  int n_input = 0;
  int max_tokens = 0;
};

struct Outcome {
  bool ok = false;
  std::string error;
  double ttft = 0, e2el = 0;  // s
  std::vector<double> itl;    // s
  int output_tokens = 0;
  int input_tokens = 0;
};

struct Stats {
  double mean = 0, median = 0, p90 = 0, p99 = 0, stdev = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  // Linear interpolation between closest ranks (numpy's default), as vLLM computes them.
  const double pos = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - double(lo));
}

Stats stats_of(const std::vector<double>& v) {
  Stats s;
  if (v.empty()) return s;
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  double var = 0;
  for (double x : v) var += (x - s.mean) * (x - s.mean);
  s.stdev = std::sqrt(var / double(v.size()));
  s.median = percentile(v, 50);
  s.p90 = percentile(v, 90);
  s.p99 = percentile(v, 99);
  return s;
}

httplib::Headers auth_headers(const BenchArgs& a) {
  httplib::Headers h;
  if (!a.api_key.empty()) h.emplace("Authorization", "Bearer " + a.api_key);
  return h;
}

Outcome run_one(const BenchArgs& a, const std::string& model, const Prompt& p) {
  Outcome o;
  o.input_tokens = p.n_input;
  httplib::Client cli(a.url);
  cli.set_read_timeout(std::chrono::seconds(int64_t(a.timeout_s)));
  cli.set_connection_timeout(std::chrono::seconds(10));
  json body = {{"model", model}, {"prompt", p.prompt}, {"max_tokens", p.max_tokens}, {"stream", true},
               {"stream_options", {{"include_usage", true}}}, {"temperature", 0.0}, {"ignore_eos", a.ignore_eos}};
  if (a.extra.is_object()) body.merge_patch(a.extra);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = auth_headers(a);
  req.set_header("Content-Type", "application/json");
  req.body = body.dump();
  std::string buf;
  const auto t0 = Clock::now();
  auto last = t0;
  bool first = true;
  int usage_tokens = -1, chunks = 0;
  auto on_line = [&](const std::string& line) {
    if (line.rfind("data: ", 0) != 0) return;
    const std::string data = line.substr(6);
    if (data == "[DONE]") return;
    json j = json::parse(data, nullptr, false);
    if (j.is_discarded()) return;
    if (j.contains("error")) {
      o.error = j["error"].value("message", "error event");
      return;
    }
    if (j.contains("usage") && j["usage"].is_object()) usage_tokens = j["usage"].value("completion_tokens", -1);
    if (!j.contains("choices") || j["choices"].empty()) return;
    const std::string text = j["choices"][0].value("text", "");
    if (text.empty()) return;
    const auto now = Clock::now();
    if (first) {
      o.ttft = std::chrono::duration<double>(now - t0).count();
      first = false;
    } else {
      o.itl.push_back(std::chrono::duration<double>(now - last).count());
    }
    last = now;
    ++chunks;
  };
  req.content_receiver = [&](const char* data, size_t len, uint64_t, uint64_t) {
    buf.append(data, len);
    size_t pos;
    while ((pos = buf.find('\n')) != std::string::npos) {
      std::string line = buf.substr(0, pos);
      if (!line.empty() && line.back() == '\r') line.pop_back();
      buf.erase(0, pos + 1);
      on_line(line);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  const bool sent = cli.send(req, res, err);
  o.e2el = std::chrono::duration<double>(Clock::now() - t0).count();
  if (!sent) {
    o.error = "request failed: " + httplib::to_string(err);
    return o;
  }
  if (res.status != 200) {
    o.error = "HTTP " + std::to_string(res.status) + " " + buf;
    return o;
  }
  if (!o.error.empty()) return o;
  o.output_tokens = usage_tokens >= 0 ? usage_tokens : chunks;
  o.ok = !first;
  if (!o.ok) o.error = "no token streamed";
  return o;
}

Result<std::string> server_model(const BenchArgs& a, int* vocab, json* card) {
  httplib::Client cli(a.url);
  cli.set_connection_timeout(std::chrono::seconds(10));
  auto res = cli.Get("/v1/models", auth_headers(a));
  if (!res) return make_error(ErrorCode::kIo, "GET " + a.url + "/v1/models failed: " + httplib::to_string(res.error()));
  if (res->status != 200) return make_error(ErrorCode::kIo, "GET /v1/models answered " + std::to_string(res->status) + ": " + res->body);
  json j = json::parse(res->body, nullptr, false);
  if (j.is_discarded() || !j.contains("data") || j["data"].empty()) return make_error(ErrorCode::kCorrupt, "GET /v1/models: no model listed");
  *vocab = j["data"][0].value("vocab_size", 0);
  *card = j["data"][0];
  return j["data"][0].value("id", std::string());
}

Result<std::vector<Prompt>> make_prompts(const BenchArgs& a, int vocab) {
  std::vector<Prompt> out;
  std::mt19937_64 rng(a.seed);
  if (!a.dataset.empty()) {
    // JSON lines: {"prompt": "..." or [ids], "max_tokens": n (optional)}; or plain text lines.
    std::ifstream f(a.dataset);
    if (!f) return make_error(ErrorCode::kIo, "--dataset: cannot read '" + a.dataset + "'");
    std::string line;
    while (std::getline(f, line) && int(out.size()) < a.num_prompts) {
      if (line.empty()) continue;
      Prompt p;
      json j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.is_object() && j.contains("prompt")) {
        p.prompt = j["prompt"];
        p.max_tokens = j.value("max_tokens", a.output_len);
      } else {
        p.prompt = line;
        p.max_tokens = a.output_len;
      }
      p.n_input = p.prompt.is_array() ? int(p.prompt.size()) : 0;
      out.push_back(std::move(p));
    }
    if (out.empty()) return make_error(ErrorCode::kInvalidArgument, "--dataset '" + a.dataset + "' holds no prompt");
    while (int(out.size()) < a.num_prompts) out.push_back(out[out.size() % out.size()]);
    return out;
  }
  if (vocab <= 0) return make_error(ErrorCode::kInvalidArgument, "the server did not report vocab_size; use --dataset");
  // Random ids away from the ends of the vocabulary, where special tokens usually sit.
  const int lo = std::min(vocab / 4, 256);
  const int hi = std::max(lo + 1, vocab - std::min(vocab / 4, 512));
  std::uniform_int_distribution<int> id(lo, hi - 1);
  for (int i = 0; i < a.num_prompts; ++i) {
    Prompt p;
    p.prompt = json::array();
    for (int k = 0; k < a.input_len; ++k) p.prompt.push_back(id(rng));
    p.n_input = a.input_len;
    p.max_tokens = a.output_len;
    out.push_back(std::move(p));
  }
  return out;
}

struct RooflineInputs {
  std::optional<RooflineShape> shape;
  double bandwidth = 0, gemm = 0;  // bytes/s, FLOP/s
  std::string source;              // where the peaks came from
  std::string why;                 // why there is no roofline
};

// The model shape (the server's card, else --model-config) and the device peaks (the flags,
// else measured here when built with CUDA and a GPU is present).
RooflineInputs roofline_inputs(const BenchArgs& a, const json& card) {
  RooflineInputs r;
  r.shape = roofline_shape_from_card(card);
  if (!r.shape && !a.model_config.empty()) {
    auto s = roofline_shape_from_dir(a.model_config);
    if (s.ok()) r.shape = *s;
    else r.why = s.error().to_string();
  }
  if (!r.shape) {
    if (r.why.empty()) r.why = "the server gives no model shape; pass --model-config DIR";
    return r;
  }
  if (a.peak_bandwidth_gbs > 0 && a.peak_tflops > 0) {
    r.bandwidth = a.peak_bandwidth_gbs * 1e9;
    r.gemm = a.peak_tflops * 1e12;
    r.source = "peaks from flags";
    return r;
  }
#ifdef STRATA_WITH_CUDA
  auto p = cuda::measure_device_peaks();
  if (p.ok()) {
    r.bandwidth = a.peak_bandwidth_gbs > 0 ? a.peak_bandwidth_gbs * 1e9 : p->bandwidth_bytes_s;
    r.gemm = a.peak_tflops > 0 ? a.peak_tflops * 1e12 : p->gemm_flops;
    r.source = "peaks measured: D2D copy 4 GiB, cuBLASLt bf16 8192^3";
    return r;
  }
  r.why = p.error().to_string();
#else
  r.why = "no --peak-bandwidth-gbs and --peak-tflops, and this build cannot measure them (no CUDA)";
#endif
  return r;
}

int run_bench_serve(const BenchArgs& args) {
  BenchArgs a = args;
  if (!a.extra_body.empty()) {
    a.extra = json::parse(a.extra_body, nullptr, false);
    if (!a.extra.is_object()) { log::error("--extra-body must be a JSON object, got '{}'", a.extra_body); return 2; }
  }
  if (a.num_prompts < 1) { log::error("--num-prompts must be >= 1"); return 2; }
  if (a.input_len < 1 || a.output_len < 1) { log::error("--random-input-len and --random-output-len must be >= 1"); return 2; }
  int vocab = 0;
  json card;
  auto listed = server_model(a, &vocab, &card);
  if (!listed.ok()) { log::error("{}", listed.error().to_string()); return 1; }
  const std::string model = a.model.empty() ? *listed : a.model;
  auto prompts = make_prompts(a, vocab);
  if (!prompts.ok()) { log::error("{}", prompts.error().to_string()); return 2; }
  const int concurrency = a.concurrency > 0 ? a.concurrency : (a.request_rate > 0 ? a.num_prompts : 1);
  const RooflineInputs roof = roofline_inputs(a, card);  // measured before the load, on an idle device

  std::vector<Outcome> outcomes(prompts->size());
  std::mutex mu;
  std::condition_variable cv;
  int in_flight = 0;
  std::vector<std::thread> threads;
  std::mt19937_64 rng(a.seed + 1);
  std::exponential_distribution<double> gap(a.request_rate > 0 ? a.request_rate : 1.0);
  const auto t0 = Clock::now();
  auto next_arrival = t0;
  for (size_t i = 0; i < prompts->size(); ++i) {
    if (a.request_rate > 0) {
      std::this_thread::sleep_until(next_arrival);
      next_arrival += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(gap(rng)));
    }
    {
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return in_flight < concurrency; });
      ++in_flight;
    }
    threads.emplace_back([&, i] {
      outcomes[i] = run_one(a, model, (*prompts)[i]);
      std::lock_guard<std::mutex> l(mu);
      --in_flight;
      cv.notify_all();
    });
  }
  for (auto& t : threads) t.join();
  const double duration = std::chrono::duration<double>(Clock::now() - t0).count();

  std::vector<double> ttft, tpot, itl, e2el;
  int64_t completed = 0, in_tokens = 0, out_tokens = 0;
  std::string first_error;
  for (const auto& o : outcomes) {
    if (!o.ok) {
      if (first_error.empty()) first_error = o.error;
      continue;
    }
    ++completed;
    in_tokens += o.input_tokens;
    out_tokens += o.output_tokens;
    ttft.push_back(o.ttft * 1000);
    e2el.push_back(o.e2el * 1000);
    if (o.output_tokens > 1) tpot.push_back((o.e2el - o.ttft) / double(o.output_tokens - 1) * 1000);
    for (double x : o.itl) itl.push_back(x * 1000);
  }
  const Stats st = stats_of(ttft), sp = stats_of(tpot), si = stats_of(itl), se = stats_of(e2el);
  std::printf("============ Serving Benchmark Result ============\n");
  std::printf("%-40s %12lld\n", "Successful requests:", (long long)completed);
  std::printf("%-40s %12lld\n", "Failed requests:", (long long)(int64_t(outcomes.size()) - completed));
  std::printf("%-40s %12d\n", "Maximum request concurrency:", concurrency);
  std::printf("%-40s %12s\n", "Request rate (req/s):", a.request_rate > 0 ? std::to_string(a.request_rate).c_str() : "inf");
  std::printf("%-40s %12.2f\n", "Benchmark duration (s):", duration);
  std::printf("%-40s %12lld\n", "Total input tokens:", (long long)in_tokens);
  std::printf("%-40s %12lld\n", "Total generated tokens:", (long long)out_tokens);
  std::printf("%-40s %12.2f\n", "Request throughput (req/s):", completed / duration);
  std::printf("%-40s %12.2f\n", "Output token throughput (tok/s):", out_tokens / duration);
  std::printf("%-40s %12.2f\n", "Total token throughput (tok/s):", (in_tokens + out_tokens) / duration);
  auto section = [](const char* title, const char* key, const Stats& s) {
    std::printf("---------------%s---------------\n", title);
    std::printf("Mean %s (ms):%*s%12.2f\n", key, int(33 - std::strlen(key)), "", s.mean);
    std::printf("Median %s (ms):%*s%12.2f\n", key, int(31 - std::strlen(key)), "", s.median);
    std::printf("P90 %s (ms):%*s%12.2f\n", key, int(34 - std::strlen(key)), "", s.p90);
    std::printf("P99 %s (ms):%*s%12.2f\n", key, int(34 - std::strlen(key)), "", s.p99);
  };
  section("Time to First Token", "TTFT", st);
  section("Time per Output Token (excl. 1st token)", "TPOT", sp);
  section("Inter-token Latency", "ITL", si);
  section("End-to-end Latency", "E2EL", se);
  std::optional<Roofline> rl;
  if (roof.shape && roof.bandwidth > 0 && roof.gemm > 0 && completed > 0) {
    RooflineWorkload w{completed, concurrency, double(in_tokens) / double(completed), double(out_tokens) / double(completed)};
    rl = roofline(*roof.shape, w, roof.bandwidth, roof.gemm);
    std::printf("---------------Roofline (%s)---------------\n", roof.source.c_str());
    std::printf("%-40s %12.1f\n", "Peak bandwidth (GB/s, read+write):", roof.bandwidth * 1e-9);
    std::printf("%-40s %12.1f\n", "Peak bf16 GEMM (TFLOP/s):", roof.gemm * 1e-12);
    std::printf("%-40s %12lld\n", "Roofline steps:", (long long)rl->steps);
    std::printf("%-40s %12.2f\n", "Roofline duration (s):", rl->seconds);
    std::printf("%-40s %12.2f\n", "Roofline output throughput (tok/s):", double(out_tokens) / rl->seconds);
    std::printf("%-40s %12.3f\n", "Fraction of roofline:", rl->seconds / duration);
  } else {
    std::printf("Roofline: %s\n", roof.why.c_str());
  }
  std::printf("==================================================\n");
  if (!first_error.empty()) log::warn("first failure: {}", first_error);
  if (!a.json_out.empty()) {
    auto js = [](const Stats& s) { return json{{"mean", s.mean}, {"median", s.median}, {"p90", s.p90}, {"p99", s.p99}, {"std", s.stdev}}; };
    json r = {{"url", a.url}, {"model", model}, {"num_prompts", a.num_prompts}, {"completed", completed},
              {"failed", int64_t(outcomes.size()) - completed}, {"max_concurrency", concurrency},
              {"request_rate", a.request_rate > 0 ? json(a.request_rate) : json("inf")},
              {"random_input_len", a.input_len}, {"random_output_len", a.output_len}, {"ignore_eos", a.ignore_eos},
              {"extra_body", a.extra},
              {"duration_s", duration}, {"total_input_tokens", in_tokens}, {"total_output_tokens", out_tokens},
              {"request_throughput", completed / duration}, {"output_throughput", out_tokens / duration},
              {"total_token_throughput", (in_tokens + out_tokens) / duration},
              {"ttft_ms", js(st)}, {"tpot_ms", js(sp)}, {"itl_ms", js(si)}, {"e2el_ms", js(se)}};
    if (!first_error.empty()) r["first_error"] = first_error;
    if (rl) {
      r["roofline"] = {{"source", roof.source}, {"bandwidth_gbs", roof.bandwidth * 1e-9}, {"gemm_tflops", roof.gemm * 1e-12},
                       {"steps", rl->steps}, {"duration_s", rl->seconds}, {"fraction", rl->seconds / duration},
                       {"output_throughput", double(out_tokens) / rl->seconds}};
    }
    std::ofstream f(a.json_out);
    if (!f) { log::error("--json: cannot write '{}'", a.json_out); return 1; }
    f << r.dump(2) << '\n';
  }
  return completed == int64_t(outcomes.size()) ? 0 : 1;
}

struct SynthArgs {
  std::string out;
  std::string preset = "tiny";
  std::string tokenizer_dir;
  int32_t vocab = 0;
  uint64_t seed = 1;
};

int run_synth(const SynthArgs& a) {
  namespace fs = std::filesystem;
  SyntheticModelSpec spec;
  if (a.preset == "qwen3-0.6b") {
    spec = qwen3_0_6b_spec();
  } else if (a.preset == "tiny") {
    spec.hidden = 64;
    spec.n_layers = 2;
    spec.n_heads = 4;
    spec.n_kv_heads = 2;
    spec.head_dim = 16;
    spec.intermediate = 128;
    spec.max_position = 4096;
  } else {
    log::error("--preset must be tiny or qwen3-0.6b, got '{}'", a.preset);
    return 2;
  }
  spec.seed = a.seed;
  if (a.vocab > 0) spec.vocab_size = a.vocab;
  std::error_code ec;
  if (!a.tokenizer_dir.empty()) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}) {
      const fs::path src = fs::path(a.tokenizer_dir) / f;
      if (!fs::exists(src, ec)) continue;
      fs::create_directories(a.out, ec);
      fs::copy_file(src, fs::path(a.out) / f, fs::copy_options::overwrite_existing, ec);
      if (ec) { log::error("cannot copy {}: {}", src.string(), ec.message()); return 1; }
    }
  }
  if (Status s = write_synthetic_checkpoint(a.out, spec); !s.ok()) {
    log::error("{}", s.error().to_string());
    return 1;
  }
  log::info("wrote {} ({} parameters)", a.out, synthetic_param_count(spec));
  return 0;
}

}  // namespace

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks against a running server");
  bench->require_subcommand(1);
  auto a = std::make_shared<BenchArgs>();
  CLI::App* serve = bench->add_subcommand("serve", "Load-generate streaming /v1/completions requests (vLLM bench serve metrics)");
  serve->add_option("--url", a->url, "Server base URL")->capture_default_str();
  serve->add_option("--model", a->model, "Model name (default: the one /v1/models lists)");
  serve->add_option("--num-prompts", a->num_prompts, "Requests to send")->capture_default_str();
  serve->add_option("--concurrency,--max-concurrency", a->concurrency, "Requests in flight at most (0: 1, or unbounded with --request-rate)");
  serve->add_option("--request-rate", a->request_rate, "Poisson arrival rate, requests/s (0: as fast as concurrency allows)");
  serve->add_option("--random-input-len", a->input_len, "Prompt tokens of random prompts")->capture_default_str();
  serve->add_option("--random-output-len", a->output_len, "max_tokens of each request")->capture_default_str();
  serve->add_option("--dataset", a->dataset, "JSON lines {\"prompt\": text or ids, \"max_tokens\": n} or text lines");
  serve->add_flag("--ignore-eos", a->ignore_eos, "Generate exactly max_tokens tokens");
  serve->add_option("--seed", a->seed, "Seed of the random prompts and arrivals")->capture_default_str();
  serve->add_option("--json", a->json_out, "Write the results as JSON to this file");
  serve->add_option("--extra-body", a->extra_body,
                    "A JSON object merged into every request body (e.g. '{\"response_format\": {...}}')");
  serve->add_option("--api-key", a->api_key, "Bearer key");
  serve->add_option("--timeout", a->timeout_s, "Seconds a request may take")->capture_default_str();
  serve->add_option("--peak-bandwidth-gbs", a->peak_bandwidth_gbs,
                    "Roofline: device copy bandwidth, GB/s read+write (default: measured when built with CUDA)");
  serve->add_option("--peak-tflops", a->peak_tflops, "Roofline: bf16 GEMM rate, TFLOP/s (default: measured when built with CUDA)");
  serve->add_option("--model-config", a->model_config, "Roofline: model directory whose config.json gives the shape (default: the server's)");
  serve->callback([a] { exit_code() = run_bench_serve(*a); });

  auto s = std::make_shared<SynthArgs>();
  CLI::App* synth = bench->add_subcommand("synth-model", "Write a random-weight qwen3-shaped Hugging Face checkpoint");
  synth->add_option("--out", s->out, "Output directory")->required();
  synth->add_option("--preset", s->preset, "tiny or qwen3-0.6b")->capture_default_str();
  synth->add_option("--tokenizer", s->tokenizer_dir, "Copy tokenizer.json, tokenizer_config.json (and chat_template.jinja) from here");
  synth->add_option("--vocab", s->vocab, "Vocabulary size (default: the preset's, 151936)");
  synth->add_option("--seed", s->seed, "Weight seed")->capture_default_str();
  synth->callback([s] { exit_code() = run_synth(*s); });
}

}  // namespace strata::cli
