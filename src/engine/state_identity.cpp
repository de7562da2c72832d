#include "engine/state_identity.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <random>

#include "core/log.h"
#include "model/weight_identity.h"

namespace strata {

namespace fs = std::filesystem;

namespace {

// No quantized weight formats or adapters exist yet; they get their fields here when they do.
constexpr const char* kQuantAndAdapters = "quant=none;adapters=";

std::string unique_identity() {
  std::random_device rd;
  char b[64];
  std::snprintf(b, sizeof(b), "unhashed:%08x%08x%08x%016llx", rd(), rd(), rd(),
                static_cast<unsigned long long>(std::chrono::steady_clock::now().time_since_epoch().count()));
  return b;
}

}  // namespace

std::string backend_numeric_identity(const std::string& device, const KvCodecConfig& resolved_codecs, bool deterministic) {
  if (device == "cpu") return "cpu:f32";
  // The device resolves auto to bf16 rows, except for f32/f16 checkpoints, whose rows stay f32
  // (cuda_kv_codecs): auto left in the config means f32 there.
  const KvCodecSpec& spec = resolved_codecs.default_spec;
  const std::string rows = spec.codec == KvCodec::kAuto ? std::string("f32") : kv_codec_spec_name(spec);
  return device + ":rows=" + rows + ";deterministic=" + (deterministic ? "1" : "0");
}

std::string state_identity(const StateIdentitySource& s) {
  std::string weights;
  if (s.dummy_weights) {
    char b[96];
    std::snprintf(b, sizeof(b), "dummy:seed=%llu;scale=%.9g;config=", static_cast<unsigned long long>(s.dummy_seed),
                  double(s.dummy_scale));
    weights = b + config_content_hash(s.model_dir);
  } else if (!s.persistent) {
    std::error_code ec;
    weights = "path=" + fs::absolute(s.model_dir, ec).lexically_normal().string();
  } else {
    WeightHashStats st;
    const auto t0 = std::chrono::steady_clock::now();
    auto w = weight_identity(s.model_dir, s.hash_cache_dir, &st);
    if (w.ok()) {
      weights = *w;
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      log::info("state identity of {}: {} ({} files hashed, {} from the hash cache, {:.0f} ms)", s.model_dir, weights,
                st.hashed_files, st.cached_files, ms);
    } else {
      weights = unique_identity();
      log::warn("cannot hash the weights of {} ({}); persisted KV and checkpoints are not reused by this run",
                s.model_dir, w.error().to_string());
    }
  }
  return weights + ";" + kQuantAndAdapters + ";backend=" + s.backend;
}

}  // namespace strata
